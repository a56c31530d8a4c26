"""Draft tokens kept per verified round at temperature > 0: a chain (rejection sampling), a tree verified by
rejection sampling over the siblings (SpecParams.tree_verify "rejection": engine/round/tree_rejection.py), and a
tree the target walks with plain sampling's draws ("walk": the drafters choose their most likely tokens).

draft-simple runs on the target itself (--draft, default the target): the upper bound of a draft model that
agrees with the target, where the difference between the three is widest; the n-gram chain drafts beside it in
the trees. Every row of the output is the mean over the prompts, with the same seeds for the three.

    .venv/bin/python scripts/tree_acceptance.py --prompts assets/prompts/unseen.jsonl --temp 0.8
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.bench.run import prompt_ids_of  # noqa: E402
from engine.bench.cli import load_prompts  # noqa: E402
from engine.draft.registry import NGRAM_CHAIN  # noqa: E402
from engine.load.models import load_model  # noqa: E402
from engine.params import GenParams, SamplerParams, SpecParams  # noqa: E402
from engine.serve.engine import Engine  # noqa: E402

CONFIGS = {  # name -> (drafters, tree nodes, tree verification)
    "chain (rejection)": (["draft-simple"], 0, "rejection"),
    "tree (rejection over siblings)": (NGRAM_CHAIN + ["draft-simple"], 12, "rejection"),
    "tree (target walks)": (NGRAM_CHAIN + ["draft-simple"], 12, "walk"),
}


def run(engine: Engine, prompt: list[int], types, tree_nodes: int, tree_verify: str, temp: float, seed: int,
        n_new: int) -> tuple[int, int, int]:
    """(draft tokens kept, verified rounds, tokens generated) of one answer."""
    params = GenParams(max_new_tokens=n_new, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                       spec=SpecParams(types=list(types), n_max=8, adaptive=False, p_min=0.0, tree_nodes=tree_nodes,
                                       tree_verify=tree_verify))
    spec = [e for e in engine.generate(prompt, params) if e.kind == "spec"]
    return sum(e.n_accepted for e in spec), len(spec), sum(len(e.emitted) for e in spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--draft", default=None, help="draft model for draft-simple (default: the target itself)")
    ap.add_argument("--prompts", default="assets/prompts/unseen.jsonl")
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--limit", type=int, default=8, help="prompts from the file")
    a = ap.parse_args()
    target = load_model(a.target)
    draft = load_model(a.draft or a.target)
    engine = Engine(target, draft=draft, n_ctx=2048, n_seq_max=1, calibrate=False)
    prompts = load_prompts(a.prompts)[:a.limit]
    print(f"target {a.target}, draft-simple on {a.draft or a.target}, temp {a.temp}, {len(prompts)} prompts from "
          f"{a.prompts}, {a.max_new_tokens} tokens each")
    print("| verification | draft tokens kept per verified round | tokens per verified round | rounds |")
    print("|---|---|---|---|")
    for name, (types, nodes, how) in CONFIGS.items():
        kept, rounds, made = [], 0, []
        for seed, p in enumerate(prompts):
            k, r, t = run(engine, prompt_ids_of(target, p, 0), types, nodes, how, a.temp, seed, a.max_new_tokens)
            kept.append(k / max(r, 1))
            made.append(t / max(r, 1))
            rounds += r
        print(f"| {name} | {statistics.mean(kept):.2f} | {statistics.mean(made):.2f} | {rounds} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
