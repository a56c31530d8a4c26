"""How long llguidance's compile of a pathological JSON schema takes, whether its limits bound it, and what the
grammar cache's child process costs and stops (engine/serve/compiler.py, engine/serve/grammars.py).

The schema: n patternProperties with additionalProperties false. Prints llguidance's compile (validate_grammar,
no tokenizer) in this process for a few n, with its default limits and with tight ones; then GrammarCache.prepare
of a 1,500-pattern schema with a short wait (refused at the child's deadline, the child killed), and of small
grammars (the child's own cost).

    .venv/bin/python scripts/grammar_compile_time.py [--sizes 100,150,200] [--wait 4]

Figures: docs/engine.md#a-grammars-compile-time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def schema(n: int) -> str:
    patterns = {f"^p{i}[a-z]{{1,{i % 30 + 2}}}$": {"type": "integer"} for i in range(n)}
    return json.dumps({"type": "object", "patternProperties": patterns, "additionalProperties": False})


def in_process(sizes: list[int]) -> None:
    from llguidance import LLMatcher, LLParserLimits

    tight = LLParserLimits(initial_lexer_fuel=10_000, max_lexer_states=1_000, max_grammar_size=1_000,
                           precompute_large_lexemes=False)
    for n in sizes:
        grammar = LLMatcher.grammar_from_json_schema(json.loads(schema(n)), defaults={"whitespace_flexible": False})
        times = []
        for limits in (None, tight):
            t0 = time.perf_counter()
            LLMatcher.validate_grammar(grammar, None, limits=limits)
            times.append(time.perf_counter() - t0)
        print(f"in process, n={n} ({len(schema(n)):,} chars): {times[0]:.2f} s default limits, "
              f"{times[1]:.2f} s tight limits")


def through_cache(wait_s: float) -> None:
    from engine.grammar import GrammarSpec
    from engine.serve import grammars
    from engine.serve.grammars import GrammarCache

    children = []

    class Recorded(grammars.ChildCompile):
        def __init__(self, grammar):
            super().__init__(grammar)
            children.append(self)

    grammars.ChildCompile = Recorded
    cache = GrammarCache(lambda: None)
    t0 = time.perf_counter()
    try:
        cache.prepare(GrammarSpec("json_schema", schema(1500)), timeout_s=wait_s)
    except ValueError as e:
        refused = time.perf_counter() - t0
        while cache.running:
            time.sleep(0.001)
        free = time.perf_counter() - t0
        print(f"cache, n=1500, wait {wait_s:.0f} s: refused after {refused:.2f} s ({e}); compiler free after "
              f"{free:.2f} s; child exit status {children[-1].returncode}")
    small = []
    for i in range(5):
        t0 = time.perf_counter()
        cache.prepare(GrammarSpec("regex", f"(red|blue|green){{{i + 1}}}"))
        small.append(time.perf_counter() - t0)
    print(f"cache, a small regex (child and all, no tokenizer): median {statistics.median(small):.2f} s of 5")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,150,200", help="patternProperties counts compiled in this process")
    ap.add_argument("--wait", type=float, default=4.0, help="the caller's wait for the 1,500-pattern schema")
    a = ap.parse_args()
    in_process([int(x) for x in a.sizes.split(",")])
    through_cache(a.wait)


if __name__ == "__main__":
    main()
