"""`python -m engine.bench.dist`: is speculative decoding with rejection sampling distributed as the target?

Rejection sampling promises that what it generates is distributed exactly as plain sampling from the target;
it does not promise the plain run's tokens for the same seed (engine.bench.lossless). This checks the promise on
whole short continuations: the first `length` tokens after one prompt, generated speculatively over many seeds,
against the exact probability of every continuation, computed from the target's own forwards (prefixes below
`prune` are left out and their mass pooled). It reports the total variation distance (TV) between the two.

Even a perfect sampler has TV > 0 from a finite number of samples, so the tolerance is the (1 - alpha)
quantile of the TV of `n_samples` draws from the exact distribution itself, simulated `n_null` times. The
check passes when TV <= tolerance. Plain sampling over the same seeds is held to the same tolerance, as a check
of the harness (the exact distribution, the sampler chain). Without --target it builds a tiny random target
and a draft near it (engine.bench.tiny_pair).

Exit status: 0 pass, 1 fail, 2 bad arguments or models (with a one-line reason on stderr).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.events import ErrorEvent
from engine.params import GenParams, SpecParams
from engine.sampling import Sampler, SamplerParams


@dataclass
class DistParams:
    types: list[str] = field(default_factory=lambda: ["draft-simple"])  # drafters; draft-simple/head give q
    temp: float = 0.3  # low enough that short continuations have a support a thousand samples can cover
    length: int = 3  # tokens per continuation: the first comes from the prefill, the rest from verified rounds
    n_max: int = 2  # draft tokens per round (every round drafts: adaptive length off, p_min 0)
    n_samples: int = 1000  # seeds, i.e. continuations per sampler
    seed: int = 0  # first seed; also seeds the simulation of the tolerance
    alpha: float = 0.001  # a perfect sampler fails with this probability
    n_null: int = 1000  # simulations of a perfect sampler's TV
    prune: float = 1e-7  # prefixes less likely than this are not expanded
    plain: bool = True  # also hold plain sampling to the tolerance
    parallel: int = 8  # seeds decoded together in slots (one forward per round for all: the speed on a tiny model)
    tree_nodes: int = 0  # > 0: drafts as a tree of at most this many nodes (rejection sampling over siblings)

    def validate(self) -> None:
        if self.temp <= 0:
            raise ValueError("--temp must be > 0: at temp 0 every sampler is argmax and the bench compares tokens")
        if min(self.length, self.n_max, self.n_samples, self.n_null, self.parallel) < 1:
            raise ValueError("--length, --n-max, --samples, --null and --parallel must be >= 1")
        if self.tree_nodes < 0:
            raise ValueError("--tree-nodes must be >= 0")
        if not 0 < self.alpha < 1 or not 0 <= self.prune < 1:
            raise ValueError("--alpha must be in (0, 1) and --prune in [0, 1)")


@dataclass
class DistReport:
    tolerance: float  # TV a perfect sampler stays under with probability 1 - alpha
    tv_spec: float
    tv_plain: float | None  # None when plain sampling was not run
    n_support: int  # continuations enumerated
    mass_left_out: float  # probability of the pruned prefixes
    n_rejection: int  # rounds verified by rejection sampling
    n_spec: int  # rounds that verified a draft
    passed: bool


def exact_distribution(model, prompt: list[int], sampler: Sampler, length: int, prune: float,
                       chunk: int = 256) -> dict[tuple[int, ...], float]:
    """P(continuation) for every continuation of `length` tokens whose prefixes are all above `prune`."""
    level: dict[tuple[int, ...], float] = {(): 1.0}
    device = next(model.parameters()).device
    for _ in range(length):
        prefixes, nxt = list(level), {}
        for i in range(0, len(prefixes), chunk):
            part = prefixes[i:i + chunk]
            ids = torch.tensor([prompt + list(s) for s in part], device=device)
            with torch.inference_mode():
                probs = sampler.probs(model(input_ids=ids).logits[:, -1]).cpu()
            for s, row in zip(part, probs):
                joint = level[s] * row.double()
                for t in torch.nonzero(joint > prune).flatten().tolist():
                    nxt[s + (t,)] = float(joint[t])
        level = nxt
    return level


def tv_of(counts: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """TV between counts [..., K] (normalised by their sum) and a distribution [K]."""
    return 0.5 * (counts / counts.sum(-1, keepdim=True) - probs).abs().sum(-1)


def tolerance(probs: torch.Tensor, n: int, p: DistParams, gen: torch.Generator) -> float:
    """The (1 - alpha) quantile of TV for n draws from `probs` itself: what sampling noise alone reaches."""
    draws = torch.multinomial(probs.float().expand(p.n_null, -1), n, replacement=True, generator=gen)
    counts = torch.zeros(p.n_null, probs.shape[0], dtype=torch.float64).scatter_add_(
        1, draws, torch.ones_like(draws, dtype=torch.float64))
    return float(torch.quantile(tv_of(counts, probs), 1 - p.alpha))


def sample(engine, prompt: list[int], types: list[str], p: DistParams) -> tuple[Counter, int, int]:
    """Continuations over seeds seed..seed+n-1; rounds verified by rejection sampling, and all verified rounds.

    The seeds run `parallel` at a time in the engine's slots: one forward per round for all of them, which on a
    tiny model is most of the speed. Each slot has its own seeded sampler, so batching changes no draw."""
    counts: Counter = Counter()
    n_rejection = n_spec = 0
    seeds = list(range(p.seed, p.seed + p.n_samples))
    width = max(1, min(p.parallel, engine.ctx.n_seq_max))
    for start in range(0, len(seeds), width):
        events: dict[int, list] = {}
        for s in seeds[start:start + width]:
            params = GenParams(max_new_tokens=p.length + p.n_max, ignore_eos=True,
                               sampling=SamplerParams(temp=p.temp, seed=s),
                               spec=SpecParams(types=list(types), n_max=p.n_max, adaptive=False, p_min=0.0,
                                               tree_nodes=p.tree_nodes))
            events[engine.start(prompt, params).seq] = []
        while engine.active():
            for e in engine.step():
                if isinstance(e, ErrorEvent):
                    raise RuntimeError(e.message)
                events[e.seq].append(e)
        for seq, evs in events.items():
            engine.release(seq)
            counts[tuple(t for e in evs for t in e.emitted)[:p.length]] += 1
            # a tree's round is rejection sampling where it tested a sampled draft (engine/round/tree_rejection.py)
            n_rejection += sum(e.verify_mode == "rejection" or bool(e.tree_tries) for e in evs if e.kind == "spec")
            n_spec += sum(e.kind == "spec" for e in evs)
    return counts, n_rejection, n_spec


def check(engine, prompt: list[int], p: DistParams) -> DistReport:
    exact = exact_distribution(engine.target.model, prompt, Sampler(SamplerParams(temp=p.temp)), p.length, p.prune)
    index = {s: i for i, s in enumerate(exact)}
    # one more bucket for every continuation left out: their pooled mass, and the samples that landed there
    probs = torch.tensor(list(exact.values()) + [0.0], dtype=torch.float64)
    probs[-1] = max(0.0, 1.0 - float(probs.sum()))

    def tv(counts: Counter) -> float:
        vec = torch.zeros_like(probs)
        for s, c in counts.items():
            vec[index.get(s, len(exact))] += c
        return float(tv_of(vec, probs))

    spec, n_rejection, n_spec = sample(engine, prompt, p.types, p)
    tv_plain = tv(sample(engine, prompt, [], p)[0]) if p.plain else None
    tol = tolerance(probs, p.n_samples, p, torch.Generator().manual_seed(p.seed))
    tv_spec = tv(spec)
    passed = tv_spec <= tol and (tv_plain is None or tv_plain <= tol)
    return DistReport(tolerance=tol, tv_spec=tv_spec, tv_plain=tv_plain, n_support=len(exact),
                      mass_left_out=float(probs[-1]), n_rejection=n_rejection, n_spec=n_spec, passed=passed)


FLAGS = (("--temp", "temp", "sampling temperature (> 0)"), ("--length", "length", "tokens per continuation"),
         ("--n-max", "n_max", "draft tokens per round"), ("--samples", "n_samples", "seeds per sampler"),
         ("--seed", "seed", "first seed"), ("--alpha", "alpha", "chance that a perfect sampler fails"),
         ("--null", "n_null", "simulations of a perfect sampler (the tolerance)"),
         ("--prune", "prune", "prefixes less likely are not enumerated"),
         ("--parallel", "parallel", "seeds decoded together in slots"),
         ("--tree-nodes", "tree_nodes", "draft a tree of at most this many nodes (0: chains)"))


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, DistParams]:
    d = DistParams()
    ap = argparse.ArgumentParser(prog="python -m engine.bench.dist", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="model to check (default: a tiny random pair, built here)")
    ap.add_argument("--draft", default=None, help="draft model for draft-simple")
    ap.add_argument("--spec", default=",".join(d.types), help="drafter types in relay order, comma-separated")
    ap.add_argument("--prompt", default=None, help="prompt text (default: one in the tiny vocabulary)")
    for flag, name, why in FLAGS:
        ap.add_argument(flag, dest=name, type=type(getattr(d, name)), default=getattr(d, name),
                        help=f"{why} (default {getattr(d, name):g})")
    ap.add_argument("--no-plain", action="store_true", help="skip plain sampling (the harness check)")
    ap.add_argument("--trust-remote-code", action="store_true")
    a = ap.parse_args(argv)
    from engine.draft.registry import parse_types

    p = DistParams(types=parse_types(a.spec), **{k: getattr(a, k) for k in vars(d) if k not in ("types", "plain")},
                   plain=not a.no_plain)
    p.validate()
    return a, p


def main(argv: list[str] | None = None) -> int:
    from engine.bench.tiny_pair import PROMPT, build_pair
    from engine.draft.draft_model import DraftModelParams
    from engine.load.models import load_model
    from engine.serve.engine import Engine

    try:
        a, p = parse_args(argv)
    except SystemExit as e:
        return 2 if e.code not in (0, None) else 0
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        try:
            target_name, draft_name = a.target, a.draft
            if target_name is None:
                target_name, draft_name = (str(x) for x in build_pair(Path(tmp)))
            target = load_model(target_name, trust_remote_code=a.trust_remote_code)
            draft = load_model(draft_name, trust_remote_code=a.trust_remote_code) if draft_name else None
            prompt = target.encode(a.prompt if a.prompt is not None else PROMPT)
            n_ctx = p.parallel * max(64, len(prompt) + p.length + 2 * p.n_max + 8)
            engine = Engine(target, draft=draft, n_ctx=n_ctx, n_seq_max=p.parallel, calibrate=False,
                            drafter_params={"draft-simple": DraftModelParams(n_seq_max=p.parallel)})
            report = check(engine, prompt, p)
        except (ValueError, RuntimeError, OSError) as e:
            print(f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
            return 2
    print(f"first {p.length} tokens after a {len(prompt)}-token prompt, temp {p.temp:g}, {','.join(p.types)} "
          f"(n_max {p.n_max}), {p.n_samples} seeds from {p.seed}")
    print(f"exact: {report.n_support} continuations above {p.prune:g} (mass left out {report.mass_left_out:.2e})")
    print(f"tolerance: TV <= {report.tolerance:.4f}, the {100 * (1 - p.alpha):g}th percentile of TV for "
          f"{p.n_samples} exact draws ({p.n_null} simulations)")
    if report.tv_plain is not None:
        print(f"plain sampling  TV {report.tv_plain:.4f}  {'ok' if report.tv_plain <= report.tolerance else 'OFF'}")
    print(f"speculative     TV {report.tv_spec:.4f}  {'ok' if report.tv_spec <= report.tolerance else 'OFF'}  "
          f"(rejection sampling in {report.n_rejection} of {report.n_spec} verified rounds)")
    print("PASS" if report.passed else "FAIL")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
