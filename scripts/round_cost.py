"""Where a round's milliseconds go: for each prompt, plain decoding and a drafter chain on the same engine, every
round split into the target's forward, the model drafters' own time, and the rest (the round's own work: n-gram
drafting, tree, budget, masks, verification, events). Prints per configuration the mean round, its parts, and
round / (forward + model drafting), the figure a round's own work should keep near 1.

    .venv/bin/python scripts/round_cost.py --prompts assets/prompts/all.jsonl --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.bench.inputs import prompt_grammar  # noqa: E402
from engine.bench.run import prompt_ids_of  # noqa: E402
from engine.draft.registry import NGRAM_CHAIN  # noqa: E402
from engine.load.models import load_model  # noqa: E402
from engine.params import GenParams, SamplerParams, SpecParams  # noqa: E402
from engine.round.round import Round  # noqa: E402
from engine.serve.engine import Engine  # noqa: E402

MODEL_DRAFTERS = ("draft-head", "draft-simple")


@dataclass
class Tally:
    rounds: list[float] = field(default_factory=list)  # seconds of each decoding round (prefill left out)
    forwards: list[float] = field(default_factory=list)  # the target forward inside it
    models: list[float] = field(default_factory=list)  # the model drafters' own time inside it
    rows: list[int] = field(default_factory=list)  # rows of its forward
    tokens: int = 0  # tokens emitted

    def line(self, name: str) -> str:
        r, f, m = (statistics.mean(x) * 1e3 for x in (self.rounds, self.forwards, self.models))
        return (f"{name:<14} {len(self.rounds):>6} {statistics.mean(self.rows):>5.2f} {r:>8.2f} {f:>8.2f} {m:>8.2f} "
                f"{r - f - m:>8.2f} {r / (f + m):>7.3f} {self.tokens / sum(self.rounds):>7.1f}")


def timed_rounds(engine: Engine, tally: Tally):
    """Wrap engine.round.run to time each call and read its forward and model drafters' time."""
    inner = engine.round.run
    model_time = {"s": 0.0}
    for name in MODEL_DRAFTERS:
        if name in engine.pool:
            drafter = engine.pool[name]
            draft = drafter.draft

            def timed_draft(requests, _draft=draft):
                t = time.perf_counter()
                try:
                    return _draft(requests)
                finally:
                    model_time["s"] += time.perf_counter() - t
            drafter.draft = timed_draft

    def run(slots):
        model_time["s"], engine.round.last_forward = 0.0, None
        t = time.perf_counter()
        events = inner(slots)
        whole = time.perf_counter() - t
        if engine.round.last_forward is not None and not any(e.kind == "prefill" for e in events):
            rows, seconds = engine.round.last_forward
            tally.rounds.append(whole)
            tally.forwards.append(seconds)
            tally.models.append(model_time["s"])
            tally.rows.append(rows)
            tally.tokens += sum(len(e.emitted) for e in events)
        return events
    engine.round.run = run


def generate(engine: Engine, p: dict, types: list[str], tree_nodes: int, n_new: int) -> list[int]:
    """One answer; a prompt with an output format is constrained, and its grammar's forced tokens lead the chain
    (as on the page)."""
    grammar = prompt_grammar(p)
    if grammar is not None and types:
        types = ["grammar"] + list(types)
    params = GenParams(max_new_tokens=n_new, sampling=SamplerParams(), grammar=grammar,
                       spec=SpecParams(types=list(types), tree_nodes=tree_nodes))
    ids = prompt_ids_of(engine.target, p, 0)
    return [t for ev in engine.generate(ids, params) for t in ev.emitted]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--target", default=None, help="default: the embedded model")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--tree-nodes", type=int, default=16)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--only", default=None, help="one configuration: plain, n-grams tree or default chain")
    a = ap.parse_args()
    target = load_model(a.target or "embedded", dtype=a.dtype)
    engine = Engine(target, n_ctx=8192, n_seq_max=1, n_draft=a.tree_nodes)
    from engine import head_fits
    configs = {"plain": ([], 0), "n-grams tree": (list(NGRAM_CHAIN), a.tree_nodes)}
    if head_fits(target):
        configs["default chain"] = (list(NGRAM_CHAIN) + ["draft-head"], a.tree_nodes)
    if a.only:
        configs = {name: c for name, c in configs.items() if name in ("plain", a.only)}
    prompts = [json.loads(line) for line in open(a.prompts) if line.strip()]
    tallies = {name: Tally() for name in configs}
    for types, _ in configs.values():
        for name in types + ["grammar"]:
            engine.drafter(name)
    generate(engine, prompts[0], [], 0, 8)  # warm the kernels
    for name, tally in tallies.items():
        timed_rounds(engine, tally)
        for p in prompts:
            generate(engine, p, *configs[name], a.max_new_tokens)
        engine.round.run = Round.run.__get__(engine.round)
    print(f"{'config':<14} {'rounds':>6} {'rows':>5} {'round':>8} {'forward':>8} {'models':>8} {'own':>8} "
          f"{'ratio':>7} {'tok/s':>7}   (ms; ratio = round / (forward + models))")
    for name, tally in tallies.items():
        print(tally.line(name))


if __name__ == "__main__":
    main()
