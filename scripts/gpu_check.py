"""One command that checks the engine on a device: right (lossless) and how fast, on random-weight models.

    python scripts/gpu_check.py --device cuda            # the shapes at full width, bfloat16 (a card)
    python scripts/gpu_check.py --device cpu --small     # the same checks on toy widths (CI, a laptop)

No downloads: every model is built from a config (engine/bench/random_models.py: the embedded model's shape, a
Llama-3-8B shape, a Gemma-3 shape). Per shape: token identity at temperature 0 with plain decoding for the
n-gram chain, trees, two slots at once, the checkpoint path and a grammar; the cost curve c(1..64) (calibrate.py);
plain tokens/s against transformers' generate() on the same model and dtype; speedups of the oracle drafter (the
plain answer as the draft: the ceiling) at n_max 4 and 8 and of synthetic acceptance 0.6 and 0.8. Once: the
rejection-sampling distribution test (engine/bench/dist.py) on a tiny pair. Writes a CSV, a PNG of the curves and
prints a table. Exit status 0 when every losslessness check passes (speed is reported, not judged).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine.bench.random_models import SHAPES, random_model  # noqa: E402
from engine.draft.registry import NGRAM_CHAIN  # noqa: E402
from engine.forward.device import DEVICE_HELP, resolve_device, synchronize  # noqa: E402
from engine.grammar import GrammarSpec  # noqa: E402
from engine.params import GenParams, SpecParams  # noqa: E402
from engine.serve.engine import Engine  # noqa: E402

PROMPT = "the cat sat on the mat . the cat sat on the mat . the dog sat on the log . the cat"
GRAMMAR = GrammarSpec("regex", "[a-z]{3,8}: [0-9]{2,4}")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help=DEVICE_HELP)
    ap.add_argument("--small", action="store_true", help="toy widths, few tokens: minutes on a CPU")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--out", default="gpu_check", help="folder for gpu_check.csv and cost_curve.png")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per timed answer (default 32 small, 256)")
    return ap.parse_args(argv)


def gen(n: int, types=(), n_max: int = 4, **spec) -> GenParams:
    return GenParams(max_new_tokens=n, ignore_eos=True,
                     spec=SpecParams(types=list(types), n_max=n_max, adaptive=False, p_min=0.0, **spec))


def answer(engine, ids, p) -> tuple[list[int], float, list]:
    """(tokens, seconds, events) of one answer; an error ends the check with its message."""
    synchronize(engine.ctx.device)
    t0 = time.perf_counter()
    events = list(engine.generate(ids, p))
    synchronize(engine.ctx.device)
    seconds = time.perf_counter() - t0
    for e in events:
        if not hasattr(e, "emitted"):
            raise RuntimeError(getattr(e, "message", str(e)))
    return [t for e in events for t in e.emitted], seconds, events


def identity(engine, ids, n: int) -> dict[str, bool]:
    """Token identity with plain decoding at temperature 0, per path."""
    plain = answer(engine, ids, gen(n))[0]
    out = {"ngram chain": answer(engine, ids, gen(n, NGRAM_CHAIN))[0] == plain,
           "trees": answer(engine, ids, gen(n, NGRAM_CHAIN, tree_nodes=12))[0] == plain,
           "checkpoint": answer(engine, ids, gen(n, NGRAM_CHAIN, rollback="checkpoint"))[0] == plain}
    other = ids[len(ids) // 2:]
    slots = [engine.start(ids, gen(n, NGRAM_CHAIN)), engine.start(other, gen(n, NGRAM_CHAIN))]
    while any(s.state != "done" for s in slots):
        engine.step()
    out["two slots"] = (list(slots[0].generated) == plain
                        and list(slots[1].generated) == answer(engine, other, gen(n))[0])
    constrained = GenParams(max_new_tokens=n, grammar=GRAMMAR)
    reference = answer(engine, ids, constrained)[0]
    constrained.spec = SpecParams(types=["grammar"] + NGRAM_CHAIN, n_max=4, adaptive=False, p_min=0.0)
    out["grammar"] = answer(engine, ids, constrained)[0] == reference
    return out


def speeds(engine, target, ids, n: int) -> dict[str, float]:
    """Plain tokens/s (ours and generate()'s) and speedups over plain of the oracle and synthetic acceptance."""
    answer(engine, ids, gen(n))  # warm-up
    plain, t_plain, _ = answer(engine, ids, gen(n))
    out = {"plain tok/s": n / t_plain, "generate() tok/s": n / hf_generate_seconds(target, ids, n)}
    for n_max in (4, 8):
        t = answer(engine, ids, gen(n, ["oracle"], n_max, reference=ids + plain))[1]
        out[f"oracle n_max {n_max} speedup"] = t_plain / t
    for accept in (0.6, 0.8):
        t = answer(engine, ids, gen(n, ["synthetic"], 4, synthetic_accept=accept))[1]
        out[f"synthetic {accept} n_max 4 speedup"] = t_plain / t
    return out


def hf_generate_seconds(target, ids, n: int) -> float:
    """transformers' greedy generate() of n tokens on the same model (stock attention), best of two."""
    model = target.model
    x = torch.tensor([ids], device=engine_device(model))
    kwargs = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(x),
                  pad_token_id=target.tokenizer.pad_token_id or 0)
    best = float("inf")
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")  # the engine switched it to its cell attention
    try:
        with torch.inference_mode():
            for _ in range(2):
                synchronize(x.device)
                t0 = time.perf_counter()
                model.generate(x, **kwargs)
                synchronize(x.device)
                best = min(best, time.perf_counter() - t0)
    finally:
        model.set_attn_implementation(previous)
    return best


def engine_device(model) -> torch.device:
    return next(model.parameters()).device


def check_shape(shape: str, a, device: str, dtype: str, n: int) -> tuple[list[dict], tuple]:
    target = random_model(shape, a.small, device=device, dtype=dtype)
    engine = Engine(target, n_ctx=1024, n_seq_max=2, n_draft=63, calibrate=False)
    cost = engine.calibrate(passes=1 if a.small else 5)
    c = [s / cost.seconds[0] for s in cost.seconds]
    ids = target.encode(PROMPT)
    rows = [dict(shape=shape, check=f"lossless: {k}", value=int(v), ok=v) for k, v in identity(engine, ids, n).items()]
    rows += [dict(shape=shape, check=k, value=round(v, 3), ok="") for k, v in speeds(engine, target, ids, n).items()]
    rows += [dict(shape=shape, check=f"c({size})", value=round(x, 3), ok="") for size, x in zip(cost.sizes, c)]
    rows.append(dict(shape=shape, check="forward", value=engine.ctx.describe_forward(), ok=""))
    del engine, target
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows, (cost.sizes, c)


def distribution(device: str, small: bool) -> dict:
    """engine/bench/dist.py's check (rejection sampling distributed as the target) on a tiny pair."""
    import tempfile

    from engine.bench.dist import DistParams, check
    from engine.bench.tiny_pair import PROMPT as TINY_PROMPT, build_pair
    from engine.draft.draft_model import DraftModelParams
    from engine.load.models import load_model

    p = DistParams(n_samples=300 if small else 1000, n_null=300 if small else 1000, length=2 if small else 3)
    with tempfile.TemporaryDirectory() as tmp:
        names = build_pair(Path(tmp))
        target, draft = (load_model(str(x), device=device) for x in names)
    prompt = target.encode(TINY_PROMPT)
    engine = Engine(target, draft=draft, n_ctx=p.parallel * 64, n_seq_max=p.parallel, calibrate=False,
                    drafter_params={"draft-simple": DraftModelParams(n_seq_max=p.parallel)})
    report = check(engine, prompt, p)
    return dict(shape="tiny pair", check="rejection sampling TV <= tolerance",
                value=f"{report.tv_spec:.4f} <= {report.tolerance:.4f}", ok=report.passed)


def write_outputs(out: Path, rows: list[dict], curves: dict) -> None:
    from engine.bench.png import write_png

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "gpu_check.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["shape", "check", "value", "ok"])
        w.writeheader()
        w.writerows(rows)
    data = [{"type": "scatter", "mode": "lines+markers", "name": s, "x": list(x), "y": list(y)}
            for s, (x, y) in curves.items()]
    layout = {"title": {"text": "c(n): a forward of n rows in forwards of one row"},
              "xaxis": {"title": {"text": "rows"}, "type": "log"}, "yaxis": {"title": {"text": "c(n)"}}}
    write_png({"data": data, "layout": layout}, out / "cost_curve.png", 800, 480)


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        device = resolve_device(a.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dtype = "bfloat16" if device.startswith("cuda") else "float32"
    n = a.tokens or (32 if a.small else 256)
    card = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    print(f"device {device} ({card}), {dtype}, {'small' if a.small else 'full'} shapes, {n} tokens per answer")
    rows, curves = [], {}
    for shape in [s.strip() for s in a.shapes.split(",") if s.strip()]:
        t0 = time.perf_counter()
        shape_rows, curves[shape] = check_shape(shape, a, device, dtype, n)
        rows += shape_rows
        print(f"{shape}: {time.perf_counter() - t0:.0f} s", flush=True)
    rows.append(distribution(device, a.small))
    write_outputs(Path(a.out), rows, curves)
    width = max(len(r["check"]) for r in rows)
    for r in rows:
        mark = "" if r["ok"] == "" else ("  ok" if r["ok"] else "  FAIL")
        print(f"{r['shape']:<18} {r['check']:<{width}}  {r['value']}{mark}")
    failed = [r for r in rows if r["ok"] is False]
    print(f"{'FAIL' if failed else 'PASS'}: {len(failed)} failed; wrote {a.out}/gpu_check.csv, cost_curve.png")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
