"""`python -m engine.bench` on a tiny model: the traces.csv contract, the lossless gate, exit codes."""

import csv
import json

import pytest

from engine import bench, benchsweep

REQUIRED = ["prompt_id", "spec_decode", "spec_types", "n_max", "temp", "seed", "concurrency", "ctx_len",
            "quant_bits", "n_gen", "tps", "tps_baseline", "speedup", "lossless_ok", "mean_acc_len",
            "draft_accept_rate", "acc_rate_pos", "verify_cost_c", "rollback_mode"]


@pytest.fixture()
def prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"id": "loop", "prompt": "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2"},
            {"id": "chat", "messages": [{"role": "user", "content": "w7 w8 w9 w7 w8"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_bench_writes_the_contract_columns_and_compares_with_hf(tiny_dirs, prompts, tmp_path, capsys):
    out = tmp_path / "traces.csv"
    code = bench.main(["--prompts", str(prompts), "--out", str(out), "--target", str(tiny_dirs["target"]),
                       "--spec", "ngram-simple,ngram-map-k", "--max-new-tokens", "24", "--compare", "hf",
                       "--n-max", "4"])
    assert code == 0
    rows = read(out)
    assert set(REQUIRED) <= set(rows[0])
    kinds = [(r["prompt_id"], r["spec_types"]) for r in rows]
    for pid in ("loop", "chat"):
        assert (pid, "") in kinds and (pid, "ngram-simple,ngram-map-k") in kinds
        assert (pid, "hf-generate") in kinds and (pid, "hf-prompt-lookup") in kinds
    assert all(r["lossless_ok"] == "True" for r in rows)
    spec = [r for r in rows if r["spec_decode"] == "on" and r["spec_types"].startswith("ngram")]
    assert all(float(r["speedup"]) > 0 and int(r["n_gen"]) == 24 for r in spec)
    assert "geomean speedup" in capsys.readouterr().out


def test_bench_parallel_and_context(tiny_dirs, prompts, tmp_path):
    out = tmp_path / "t.csv"
    code = bench.main(["--prompts", str(prompts), "--out", str(out), "--target", str(tiny_dirs["target"]),
                       "--spec", "ngram-simple", "--max-new-tokens", "12", "--parallel", "2", "--ctx-len", "30",
                       "--repeat", "2"])
    assert code == 0
    rows = read(out)
    assert {r["concurrency"] for r in rows} == {"2"} and {r["ctx_len"] for r in rows} == {"30"}


@pytest.mark.parametrize("extra,why", [
    (["--n-min", "5", "--n-max", "2"], "n_min"),
    (["--spec", "ngram-nope"], "unknown drafter"),
    (["--target", "/no/such/dir"], "not found"),
    (["--parallel", "0"], "--parallel"),
])
def test_bad_arguments_exit_2_with_a_reason(tiny_dirs, prompts, tmp_path, capsys, extra, why):
    args = ["--prompts", str(prompts), "--out", str(tmp_path / "x.csv"), "--target", str(tiny_dirs["target"])]
    assert bench.main(args + extra) == 2
    err = capsys.readouterr().err
    assert why in err and len(err.strip().splitlines()) == 1


def test_missing_prompts_file_exits_2(tmp_path, capsys):
    assert bench.main(["--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_lossy_run_makes_the_bench_exit_1(tiny_dirs, prompts, tmp_path, monkeypatch):
    real = benchsweep.run_ours

    def lossy(cfg, engine, group, spec, reference=None, warmup=False):
        results = real(cfg, engine, group, spec, reference=reference, warmup=warmup)
        if spec:
            for r in results:
                r.lossless_ok = False
        return results

    monkeypatch.setattr(benchsweep, "run_ours", lossy)
    out = tmp_path / "l.csv"
    code = bench.main(["--prompts", str(prompts), "--out", str(out), "--target", str(tiny_dirs["target"]),
                       "--spec", "ngram-simple", "--max-new-tokens", "8"])
    assert code == 1
    assert any(r["lossless_ok"] == "False" for r in read(out))
