"""Sweeps of the bench: the cross product of n_max x concurrency x context length (x synthetic acceptance).

One engine serves every configuration (slots for the widest concurrency, cells for the longest context), so
the sweep loads the model once. For each context length and concurrency the prompts run in groups of that
many slots; a short last group is filled up with prompts from the start of the list so that every group
really runs `parallel` slots (rows are written for each prompt once, not for the fillers). The plain run of a
group is the baseline of every speculative configuration of that group: the chain at each n_max, and the
synthetic-acceptance runs (drafter `synthetic`, adaptive length off, so k = n_max every round).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from engine.bench.rows import make_row
from engine.bench.run import BenchConfig, RunResult, group_tps, prompt_ids_of, run_ours
from engine.params import SpecParams

SLACK = 8  # cells per slot beyond prompt + context + answer + draft (the engine keeps a little room)


@dataclass
class Sweep:
    n_max: list[int]  # draft lengths (the chain's cap; synthetic drafts are exactly this long)
    parallel: list[int]  # concurrencies: slots decoding at once in one batched forward
    ctx_len: list[int]  # filler tokens put before every prompt
    # synthetic acceptance: a probability, or one per draft position (a tuple, the last for the positions past
    # it); [] = none
    synthetic: list[float | tuple[float, ...]]

    def n_configs(self, chain: bool) -> int:
        """Speculative configurations per (ctx_len, parallel) group."""
        return len(self.n_max) * (int(chain) + len(self.synthetic))


def parse_list(text: str, flag: str, kind: type, lo: float, hi: float | None = None) -> list:
    """'2,4,8' -> [2, 4, 8]; every value of type `kind` in [lo, hi]. Raises ValueError with a one-line reason."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = kind(part)
        except ValueError:
            raise ValueError(f"{flag}: {part!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise ValueError(f"{flag}: {part} must be {bound}")
        out.append(value)
    if not out:
        raise ValueError(f"{flag}: no value given")
    return list(dict.fromkeys(out))


def sweep_from_args(a) -> Sweep:
    synthetic = parse_synthetic(a.synthetic_accept) if a.synthetic_accept else []
    return Sweep(n_max=parse_list(a.n_max, "--n-max", int, 0), parallel=parse_list(a.parallel, "--parallel", int, 1),
                 ctx_len=parse_list(a.ctx_len, "--ctx-len", int, 0), synthetic=synthetic)


def parse_synthetic(text: str) -> list[float | tuple[float, ...]]:
    """--synthetic-accept: comma-separated runs, each a probability (0.8) or rates per position (0.9/0.7/0.5)."""
    out: list[float | tuple[float, ...]] = []
    for item in str(text).split(","):
        try:
            rates = tuple(float(x) for x in item.split("/"))
        except ValueError:
            raise ValueError(f"--synthetic-accept: {item!r} is not a probability or rates joined by /") from None
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"--synthetic-accept: {item!r} is outside [0, 1]")
        out.append(rates if len(rates) > 1 else rates[0])
    return list(dict.fromkeys(out))


def cells_needed(target, prompts: list[dict], sweep: Sweep, max_new_tokens: int) -> int:
    """KV cells for the widest group at the longest context: every slot's prompt, context, answer and draft."""
    longest = max(len(prompt_ids_of(target, p, ctx)) for p in prompts for ctx in sweep.ctx_len)
    per_slot = longest + max_new_tokens + max(sweep.n_max) + SLACK
    n_pos = int(getattr(target.model.config, "max_position_embeddings", 0) or 0)
    if n_pos and per_slot > n_pos:  # refuse now rather than fail half-way through the sweep
        raise ValueError(f"prompt + context + answer need {per_slot} positions (--ctx-len {max(sweep.ctx_len)}, "
                         f"--max-new-tokens {max_new_tokens}); the model has {n_pos}")
    return per_slot * max(sweep.parallel)


def groups_of(prompts: list[dict], parallel: int) -> list[tuple[list[dict], list[dict]]]:
    """(prompts with rows, fillers) per group: every group runs exactly `parallel` slots."""
    out = []
    for start in range(0, len(prompts), parallel):
        own = prompts[start:start + parallel]
        fill = [prompts[(start + len(own) + j) % len(prompts)] for j in range(parallel - len(own))]
        out.append((own, fill))
    return out


def spec_configs(cfg: BenchConfig, sweep: Sweep) -> list[tuple[str, BenchConfig]]:
    """(spec_types label, configuration) of every speculative run of one group."""
    out = []
    for n_max in sweep.n_max:
        if cfg.spec.types:
            out.append((",".join(cfg.spec.types), replace(cfg, spec=replace(cfg.spec, n_max=n_max))))
        for p in sweep.synthetic:
            spec = SpecParams(types=["synthetic"], n_max=n_max, n_min=0, adaptive=False, rollback=cfg.spec.rollback,
                              synthetic_accept=p)
            out.append(("synthetic", replace(cfg, spec=spec)))
    return out


def _median_run(runs: list[list[RunResult]]) -> list[RunResult]:
    """Of the repeats of a group, the one with the median aggregate speed (its rows stay self-consistent)."""
    ranked = sorted(runs, key=group_tps)
    return ranked[(len(ranked) - 1) // 2]


def run_sweep(cfg: BenchConfig, engine, prompts: list[dict], sweep: Sweep, repeat: int, compare,
              model: str) -> list[dict]:
    """Every configuration of the sweep on every prompt; one row per prompt and configuration."""
    from tqdm import tqdm

    rows = []
    run_ours(cfg, engine, prompts[:1], spec=False, warmup=True)
    if cfg.spec.types:  # the drafters' first build (the draft head's weights, its kernels) is not a round's cost
        run_ours(cfg, engine, prompts[:1], spec=True, warmup=True)
    n_groups = sum(len(groups_of(prompts, n)) for n in sweep.parallel) * len(sweep.ctx_len)
    bar = tqdm(total=n_groups * repeat * (1 + sweep.n_configs(bool(cfg.spec.types))), desc="bench",
               file=sys.stderr, disable=None)
    for ctx_len in sweep.ctx_len:
        for parallel in sweep.parallel:
            base_cfg = replace(cfg, parallel=parallel, ctx_len=ctx_len, spec=replace(cfg.spec, n_max=sweep.n_max[0]))
            for own, fill in groups_of(prompts, parallel):
                rows.extend(_run_group(base_cfg, engine, own, fill, sweep, repeat, compare, model, bar))
    bar.close()
    return rows


def _run_group(cfg: BenchConfig, engine, own: list[dict], fill: list[dict], sweep: Sweep, repeat: int,
               compare, model: str, bar) -> list[dict]:
    """The plain run and every speculative configuration of one group, repeats interleaved (plain, spec...,
    plain, spec...) so that a slow spell of a shared machine hits both sides of a ratio alike."""
    group = own + fill
    configs = spec_configs(cfg, sweep)
    base_runs: list[list[RunResult]] = []
    spec_runs: list[list[list[RunResult]]] = [[] for _ in configs]
    for _ in range(repeat):
        base_runs.append(run_ours(cfg, engine, group, spec=False))
        bar.update(1)
        for j, (_, spec_cfg) in enumerate(configs):
            spec_runs[j].append(run_ours(spec_cfg, engine, group, spec=True, reference=base_runs[-1]))
            bar.update(1)
    base = _median_run(base_runs)
    rows = [make_row(cfg, p, [base[i]], None, "", model, group_tps(base)) for i, p in enumerate(own)]
    for (name, spec_cfg), runs in zip(configs, spec_runs):
        run = _median_run(runs)
        rows += [make_row(spec_cfg, p, [run[i]], [base[i]], name, model, group_tps(run)) for i, p in enumerate(own)]
    if compare is not None and cfg.parallel == 1:  # they run one prompt at a time: no concurrency rows
        for i, p in enumerate(own):
            for kind in compare.kinds():
                other = [compare.run(kind, cfg, engine, p, base[i]) for _ in range(repeat)]
                rows.append(make_row(cfg, p, other, [base[i]], kind, model, 0.0))
    return rows
