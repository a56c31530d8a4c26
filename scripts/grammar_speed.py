"""Constrained speculative decoding against constrained plain decoding on the embedded model: JSON-schema
prompts (records from a paragraph, lists of objects), one slot, temperature 0. Prints ms per token, the speed-up,
and each drafter's share of the accepted draft tokens (from the chain's counters), and checks the outputs match.

    .venv/bin/python scripts/grammar_speed.py [--cases 0,3,6] [--reps 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="0,3,6", help="indexes into tests/grammar_prompts.py CASES")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per setting (the best counts)")
    ap.add_argument("--max-new", type=int, default=96)
    a = ap.parse_args()

    from engine.draft.registry import NGRAM_CHAIN
    from engine.grammar import GrammarSpec
    from engine.load.models import load_model
    from engine.params import GenParams, SpecParams
    from engine.serve.engine import Engine
    from grammar_prompts import CASES, messages, schema_text

    target = load_model("embedded")
    engine = Engine(target, n_ctx=2048, n_seq_max=1)
    settings = {"plain": [], "grammar": ["grammar"], "ngram chain": NGRAM_CHAIN,
                "grammar + ngram chain": ["grammar"] + NGRAM_CHAIN}
    for i in [int(x) for x in a.cases.split(",")]:
        case = CASES[i]
        ids = target.encode_chat(messages(case))
        print(f"\n{case[1]}: {case[0]}")
        base_ms, want = None, None
        for label, types in settings.items():
            def params():
                return GenParams(max_new_tokens=a.max_new, spec=SpecParams(types=list(types)),
                                 grammar=GrammarSpec("json_schema", schema_text(case)))
            list(engine.generate(ids, params()))  # warm: the length policy and caches see this prompt once
            best, toks, rounds = float("inf"), [], 0
            for _ in range(a.reps):
                engine.chain.stats.clear()
                t0 = time.perf_counter()
                events = list(engine.generate(ids, params()))
                best = min(best, time.perf_counter() - t0)
                toks = [t for ev in events for t in ev.emitted]
                rounds = len(events)
            ms = best * 1e3 / len(toks)
            if base_ms is None:
                base_ms, want = ms, toks
                print(f"  {label:22s} {len(toks):3d} tokens {rounds:3d} rounds {ms:6.1f} ms/token  "
                      f"{target.decode(toks)}")
                continue
            acc = {n: s.n_acc_tokens for n, s in engine.chain.stats.items() if s.n_acc_tokens}
            total = sum(acc.values())
            share = ", ".join(f"{n} {v / total:.0%}" for n, v in acc.items()) if total else "none accepted"
            print(f"  {label:22s} {len(toks):3d} tokens {rounds:3d} rounds {ms:6.1f} ms/token  "
                  f"x{base_ms / ms:4.2f}  accepted {total} ({share})  same={toks == want}")


if __name__ == "__main__":
    main()
