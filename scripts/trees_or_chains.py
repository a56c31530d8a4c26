"""The page's default against chains of its own drafters, on held-out prompts, interleaved prompt by prompt.

Configurations: plain decoding; the n-gram chain; the page's starting chain (engine.starting_chain: the n-grams,
then the draft head where it fits) as a chain; the same drafters in trees of 16 nodes; and the page's default as
the load's probes chose it (ui/presets.py: `probe_model_drafters` leaves out what cannot pay, `probe_trees` picks
chains or trees). Each prompt runs every configuration in turn (the order
rotated per prompt), so a slow second of the machine falls on all of them. Decode speed is tokens after the first
over the time after the prefill (RoundEvent.t_end), summed over the prompts; the ratio is over plain decoding.

    .venv/bin/python scripts/trees_or_chains.py --prompts assets/prompts/heldout.jsonl --temps 0,0.8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.bench.cli import load_prompts  # noqa: E402
from engine.bench.run import prompt_ids_of  # noqa: E402
from engine.draft.registry import NGRAM_CHAIN, starting_chain  # noqa: E402
from engine.load.models import load_model  # noqa: E402
from engine.serve.engine import Engine  # noqa: E402


def main() -> int:
    from ui.loader import measure_roofline
    from ui.presets import PROBE_PROMPT, decode_time, probe_model_drafters, probe_trees

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--prompts", default="assets/prompts/heldout.jsonl")
    ap.add_argument("--temps", default="0,0.8")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--limit", type=int, default=0, help="prompts from the file (0: all)")
    a = ap.parse_args()
    target = load_model(a.target)
    engine = Engine(target, n_ctx=4096, n_seq_max=1)
    chain = starting_chain(target)
    # the page's default as ui/loader.py makes it: without the model drafters that cannot pay, trees by the probe
    left_out = probe_model_drafters(engine, target.encode_chat([{"role": "user", "content": PROBE_PROMPT}]), chain,
                                    measure_roofline(target, engine))
    kept = [t for t in chain if t not in left_out]
    choice = probe_trees(engine, target, kept)
    print(f"probe: left out {left_out or 'nothing'}; {choice.why}")
    configs = {"plain": ([], 0), "n-gram chain": (list(NGRAM_CHAIN), 0), "starting chain": (chain, 0),
               "starting drafters in trees of 16": (chain, 16),
               f"page default ({', '.join(kept)}; {'trees' if choice.nodes else 'chains'})": (kept, choice.nodes)}
    prompts = load_prompts(a.prompts)[: a.limit or None]
    ids = [prompt_ids_of(target, p, 0) for p in prompts]
    print(f"target {a.target} ({', '.join(chain)}), {len(prompts)} prompts from {a.prompts}, "
          f"{a.max_new_tokens} tokens each")
    for temp in [float(t) for t in a.temps.split(",")]:
        totals = {name: [0, 0.0] for name in configs}
        for i, prompt in enumerate(ids):
            names = list(configs)
            for name in names[i % len(names):] + names[: i % len(names)]:
                types, nodes = configs[name]
                n, s = decode_time(engine, prompt, types, nodes, a.max_new_tokens, temp, 1000 + i)
                totals[name][0] += n
                totals[name][1] += s
        plain = totals["plain"][0] / totals["plain"][1]
        print(f"\ntemperature {temp:g}\n| configuration | tokens/s | over plain |\n|---|---|---|")
        for name, (n, s) in totals.items():
            print(f"| {name} | {n / s:.1f} | {n / s / plain:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
