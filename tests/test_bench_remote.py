"""`python -m engine.bench --compare remote:URL`: our engine and a (fake) server on the same prompts, side by side,
in one table and a CSV beside --out, with the server's text checked against its own plain run."""

from __future__ import annotations

import csv
import json
from functools import partial

import pytest

from engine.bench import cli, remote_side
from engine.remote.client import RemoteConfig
from engine.bench.remote_side import RemoteTargets, position_figure, split_remote, write_png
from fake_servers import FakeServer, serve_asgi


def test_the_compare_list_gives_up_its_servers():
    assert split_remote("hf,remote:http://h:8080/v1") == ("hf", RemoteTargets("http://h:8080/v1"))
    assert split_remote("remote:http://a:1,remote-plain:http://b:2") == (
        None, RemoteTargets("http://a:1", "http://b:2"))
    assert split_remote("hf") == ("hf", None) and split_remote(None) == (None, None)
    with pytest.raises(ValueError, match="goes with remote:URL"):
        split_remote("remote-plain:http://b:2")


@pytest.fixture()
def bench_prompts(tmp_path):
    """Two prompts whose answers the tiny model copies from them, so our n-grams draft."""
    path = tmp_path / "p.jsonl"
    rows = [{"id": "loop", "prompt": "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2"},
            {"id": "chat", "prompt": "w10 w11 w12 w13 w10 w11 w12 w13 w10 w11"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(remote_side, "RemoteConfig", partial(RemoteConfig, backoff_s=0.01, retries=1))


def bench(tiny_dirs, bench_prompts, out, compare: str) -> tuple[int, list[dict]]:
    code = cli.main(["--prompts", str(bench_prompts), "--out", str(out), "--target", str(tiny_dirs["target"]),
                     "--spec", "ngram-cache", "--max-new-tokens", "32", "--n-max", "4",
                     "--dtype", "float32", "--compare", compare])
    side = out.with_name(out.stem + "-remote.csv")
    return code, list(csv.DictReader(side.open())) if side.exists() else []


def test_our_engine_and_a_llama_server_side_by_side(tiny_dirs, bench_prompts, tmp_path, capsys):
    fake = FakeServer()
    with serve_asgi(fake.app()) as url:
        code, rows = bench(tiny_dirs, bench_prompts, tmp_path / "traces.csv", f"remote:{url}")
    assert code == 0
    assert [(r["prompt_id"], r["side"]) for r in rows] == [("loop", "ours"), ("loop", "llama-server"),
                                                          ("chat", "ours"), ("chat", "llama-server")]
    ours, theirs = rows[0], rows[1]
    assert ours["text_vs_plain"] == "same" and float(ours["tps"]) > 0 and float(ours["mean_acc_len"]) > 1
    assert 0 < float(ours["acc_pos_1"]) <= 1 and ours["suggested_n_max"] != ""
    assert float(theirs["acc_pos_1"]) == 0.75 and float(theirs["acc_pos_4"]) == 0.25
    assert float(theirs["mean_acc_len"]) == 3.25 and float(theirs["speedup"]) == pytest.approx(1.8)
    assert theirs["text_vs_plain"] == "same" and theirs["suggested_n_max"] == "3"
    assert [b.get("speculative.n_max") for _, b in fake.requests] == [None, 0, None, 0]
    printed = capsys.readouterr().out
    assert "side by side with" in printed and "llama-server serving fake/model" in printed and "FLAG" not in printed
    assert "llama-server: speculation pays on these prompts: 1.80x" in printed
    assert "llama-server: n_max 3 is predicted best" in printed
    figure = position_figure(rows)
    assert [t["name"] for t in figure["data"]] == ["ours", "llama-server"]
    assert write_png(rows, tmp_path / "remote.png").stat().st_size > 1000


def test_a_vllm_server_is_compared_with_its_plain_twin_and_a_differing_text_is_flagged(tiny_dirs, bench_prompts,
                                                                                     tmp_path, capsys):
    spec, plain = FakeServer(kind="vllm"), FakeServer(kind="vllm", words=["Another", " text", "."])
    plain.words += [" pad"] * 7  # as many tokens as the speculative answer: only the text differs
    with serve_asgi(spec.app()) as url, serve_asgi(plain.app()) as plain_url:
        code, rows = bench(tiny_dirs, bench_prompts, tmp_path / "t.csv", f"remote:{url},remote-plain:{plain_url}")
    assert code == 0 and len(plain.requests) == 2 and len(spec.requests) == 2
    theirs = [r for r in rows if r["side"] == "vllm"]
    assert all(r["text_vs_plain"] == "DIFFERS" and float(r["acc_pos_2"]) == 0.75 for r in theirs)
    assert "FLAG: the server's text differs from its own plain run on loop, chat" in capsys.readouterr().out


def test_an_unreachable_server_stops_the_bench_before_it_runs(tiny_dirs, bench_prompts, tmp_path, capsys):
    from loadclient import free_port

    code, _ = bench(tiny_dirs, bench_prompts, tmp_path / "t.csv", f"remote:http://127.0.0.1:{free_port()}")
    assert code == 2 and "cannot reach the server" in capsys.readouterr().err
