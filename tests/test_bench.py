"""`python -m engine.bench` on a tiny model: the traces.csv contract, the lossless gate, exit codes."""

import json
from pathlib import Path

import pytest

from engine.bench import cli, sweep
from engine.bench.rows import load_rows

REQUIRED = ["prompt_id", "spec_decode", "spec_types", "n_max", "temp", "seed", "concurrency", "ctx_len",
            "quant_bits", "n_gen", "tps", "tps_baseline", "speedup", "lossless_ok", "mean_acc_len",
            "draft_accept_rate", "acc_rate_pos", "verify_cost_c", "rollback_mode"]


def test_bench_writes_the_contract_columns_and_compares_with_hf(tiny_dirs, bench_prompts, tmp_path, capsys):
    out = tmp_path / "traces.csv"
    code = cli.main(["--prompts", str(bench_prompts), "--out", str(out), "--target", str(tiny_dirs["target"]),
                     "--spec", "ngram-simple,ngram-map-k", "--max-new-tokens", "24", "--compare", "hf",
                     "--n-max", "4", "--dtype", "float32"])
    assert code == 0
    rows = load_rows(out)
    assert set(REQUIRED) <= set(rows[0])
    kinds = [(r["prompt_id"], r["spec_types"]) for r in rows]
    for pid in ("loop", "chat"):
        assert (pid, "") in kinds and (pid, "ngram-simple,ngram-map-k") in kinds
        assert (pid, "hf-generate") in kinds and (pid, "hf-prompt-lookup") in kinds
    ours = [r for r in rows if not r["spec_types"].startswith("hf-")]
    assert all(r["lossless_ok"] == "True" for r in ours)
    assert {r["dtype"] for r in rows} == {"float32"}  # a tiny model: auto times a layer, float32 on any CPU here
    other = [r for r in rows if r["spec_types"].startswith("hf-")]
    assert all(r["lossless_ok"] == "n/a" for r in other)
    # transformers' stock float32 generate and our engine in float32 give the same greedy text
    assert all(r["match_plain"] == r["n_gen"] == "24" for r in other)
    spec = [r for r in rows if r["spec_decode"] == "on" and r["spec_types"].startswith("ngram")]
    assert all(float(r["speedup"]) > 0 and int(r["n_gen"]) == 24 for r in spec)
    # tokens per target forward: the prefill's token and forward left out, so plain decoding is exactly 1
    plain = [r for r in ours if r["spec_decode"] == "off"]
    assert all(float(r["tokens_per_forward"]) == 1.0 for r in plain)
    for r in spec:
        assert float(r["tokens_per_forward"]) == pytest.approx(23 / int(r["n_rounds"]), abs=1e-4)
        assert float(r["tokens_per_forward"]) >= 1.0
    assert "tokens per target forward" in capsys.readouterr().out
    # the run can be repeated as it was: its command, repeats, warm-ups and the model's files by their hash
    assert {r["command"] for r in rows} == {"python -m engine.bench --prompts " + str(bench_prompts) + " --out " +
                                            str(out) + " --target " + str(tiny_dirs["target"]) + " --spec "
                                            "ngram-simple,ngram-map-k --max-new-tokens 24 --compare hf --n-max 4 "
                                            "--dtype float32"}
    assert {(r["repeats"], r["warmups"], r["device"]) for r in rows} == {("1", "2", "cpu")}
    assert len({r["model_sha256"] for r in rows}) == 1 and len(rows[0]["model_sha256"]) == 64


def test_bench_parallel_and_context(tiny_dirs, bench_prompts, tmp_path):
    out = tmp_path / "t.csv"
    code = cli.main(["--prompts", str(bench_prompts), "--out", str(out), "--target", str(tiny_dirs["target"]),
                     "--spec", "ngram-simple", "--max-new-tokens", "12", "--parallel", "2", "--ctx-len", "30",
                     "--repeat", "2"])
    assert code == 0
    rows = load_rows(out)
    assert {r["concurrency"] for r in rows} == {"2"} and {r["ctx_len"] for r in rows} == {"30"}


@pytest.mark.parametrize("extra,why", [
    (["--n-min", "5", "--n-max", "2"], "n_min"),
    (["--spec", "ngram-nope"], "unknown drafter"),
    (["--target", "/no/such/dir"], "not found"),
    (["--parallel", "0"], "--parallel"),
    (["--compare", "vllm"], "--compare takes"),
    (["--compare", "llama.cpp"], "needs a .gguf target"),
    (["--head-tree", "4,4"], "BRANCH,WIDTH,MIN_SCORE"),
    (["--head-tree", "0,4,0.2"], "branch and width"),
])
def test_bad_arguments_exit_2_with_a_reason(tiny_dirs, bench_prompts, tmp_path, capsys, extra, why):
    args = ["--prompts", str(bench_prompts), "--out", str(tmp_path / "x.csv"), "--target", str(tiny_dirs["target"])]
    assert cli.main(args + extra) == 2
    err = capsys.readouterr().err
    assert why in err and len(err.strip().splitlines()) == 1


def test_head_tree_shape_reaches_the_draft_head(tiny_target, bench_prompts):
    from engine.bench.run import BenchConfig
    from engine.draft.head.tree import HeadTreeParams

    a = cli.parse_args(["--prompts", str(bench_prompts), "--tree", "on", "--head-tree", "8, 8, 0.005"])
    engine = BenchConfig.from_args(a, n_max=16, parallel=1, ctx_len=0).build(tiny_target, None)
    assert engine.drafter_params["draft-head"].tree == HeadTreeParams(branch=8, width=8, min_score=0.005)
    a = cli.parse_args(["--prompts", str(bench_prompts)])
    assert BenchConfig.from_args(a, n_max=16, parallel=1, ctx_len=0).head_tree is None


def test_missing_prompts_file_exits_2(tmp_path, capsys):
    assert cli.main(["--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_lossy_run_makes_the_bench_exit_1(tiny_dirs, bench_prompts, tmp_path, monkeypatch):
    real = sweep.run_ours

    def lossy(cfg, engine, group, spec, reference=None, warmup=False):
        results = real(cfg, engine, group, spec, reference=reference, warmup=warmup)
        if spec:
            for r in results:
                r.lossless_ok = False
        return results

    monkeypatch.setattr(sweep, "run_ours", lossy)
    out = tmp_path / "l.csv"
    code = cli.main(["--prompts", str(bench_prompts), "--out", str(out), "--target", str(tiny_dirs["target"]),
                     "--spec", "ngram-simple", "--max-new-tokens", "8"])
    assert code == 1
    assert any(r["lossless_ok"] == "False" for r in load_rows(out))


def test_rejection_sampling_rows_are_not_token_compared_and_ngram_rows_are(tiny_dirs, bench_prompts, tmp_path,
                                                                           capsys):
    """At temp > 0 a draft model's drafts are verified by rejection sampling: same distribution as plain
    sampling, other tokens for the same seed. Those rows say n/a (and why) instead of failing the run; n-gram
    drafts at the same temperature are verified by sample-and-match and still compared token for token."""
    common = ["--prompts", str(bench_prompts), "--target", str(tiny_dirs["target"]), "--temp", "0.7", "--n-max", "4",
              "--ignore-eos"]
    out = tmp_path / "draft.csv"
    assert cli.main(common + ["--out", str(out), "--draft", str(tiny_dirs["draft"]), "--spec", "draft-simple",
                              "--p-min", "0", "--max-new-tokens", "24"]) == 0
    spec = [r for r in load_rows(out) if r["spec_decode"] == "on"]
    assert spec and all(r["lossless_ok"] == "n/a" and "rejection" in r["verify_mode"] for r in spec)
    assert "lossless n/a: verified by rejection sampling" in capsys.readouterr().out
    out = tmp_path / "ngram.csv"
    # sampled text of a tiny model rarely repeats itself: long enough that some n-gram drafts are verified
    assert cli.main(common + ["--out", str(out), "--spec", "ngram-simple", "--max-new-tokens", "100"]) == 0
    spec = [r for r in load_rows(out) if r["spec_decode"] == "on"]
    assert spec and all(r["lossless_ok"] == "True" for r in spec)
    assert any(r["verify_mode"] == "match" for r in spec), "no n-gram draft was verified: nothing was compared"
    assert "lossless n/a" not in capsys.readouterr().out


def test_lossless_check_compares_tokens_only_where_the_run_promises_them():
    from engine.bench.lossless import lossless_check, why_na
    from engine.events import RoundEvent

    def spec_round(mode):
        return RoundEvent(seq=0, round=1, kind="spec", drafter="x", pos_sampled=3, p0=4, drafted=[5],
                          verify_mode=mode)

    assert lossless_check([1, 2], [1, 2], [spec_round("match")]) is True
    assert lossless_check([1, 2], [1, 3], [spec_round("match")]) is False
    assert lossless_check([1, 2], [1, 3], [spec_round("match"), spec_round("rejection")]) == "n/a"
    assert lossless_check([1, 2], [1, 3], [spec_round("synthetic")]) == "n/a"
    assert lossless_check([1, 2], [1, 3], [], synthetic=True) == "n/a"
    assert why_na({"lossless_ok": "n/a", "verify_mode": "match;rejection", "synthetic_accept": ""}) == "rejection"
    assert why_na({"lossless_ok": "n/a", "verify_mode": "", "synthetic_accept": "0.5"}) == "synthetic"
    assert why_na({"lossless_ok": "True", "verify_mode": "match"}) is None


SCHEMA_PROMPTS = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "schema.jsonl"


def test_a_grammar_constrains_plain_and_speculative_runs_alike(embedded, tmp_path, monkeypatch):
    """A prompt's own json_schema wins over the run's --regex; the other prompt takes the regex. Both runs are
    constrained, so the lossless check compares like with like, and the grammar drafter leads the chain."""
    import engine.load.models

    monkeypatch.setattr(engine.load.models, "load_model", lambda name, **kw: embedded)  # the session's model, loaded once
    record = json.loads(SCHEMA_PROMPTS.read_text().splitlines()[0])
    yes_no = {"id": "yes-no", "messages": [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]}
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(record) + "\n" + json.dumps(yes_no) + "\n")
    out = tmp_path / "g.csv"
    code = cli.main(["--prompts", str(prompts), "--out", str(out), "--spec", "ngram-simple", "--n-max", "8",
                     "--max-new-tokens", "24", "--regex", "(yes|no)\\."])
    assert code == 0
    rows = load_rows(out)
    assert {(r["prompt_id"], r["grammar"]) for r in rows} == {(record["id"], "json_schema"), ("yes-no", "regex")}
    assert all(r["lossless_ok"] == "True" for r in rows)
    spec = {r["prompt_id"]: r for r in rows if r["spec_decode"] == "on"}
    assert all(r["spec_types"] == "grammar,ngram-simple" for r in spec.values())
    assert int(spec[record["id"]]["forced_tokens"]) > 0  # '{"name":"' at least is forced by the schema
    assert all(r["forced_tokens"] == "0" for r in rows if r["spec_decode"] == "off")


@pytest.mark.parametrize("extra,why", [
    (["--json-schema", "SCHEMA"], "JSON schema is not valid JSON"),
    (["--regex", "(yes|no)", "--ignore-eos"], "ignore_eos"),
    (["--regex", "a", "--grammar", "g.lark"], "not allowed with"),
])
def test_bad_grammar_arguments_exit_2_with_a_reason(tiny_dirs, bench_prompts, tmp_path, capsys, extra, why):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    args = ["--prompts", str(bench_prompts), "--out", str(tmp_path / "x.csv"), "--target", str(tiny_dirs["target"])]
    assert cli.main(args + [str(bad) if x == "SCHEMA" else x for x in extra]) == 2
    assert why in capsys.readouterr().err
