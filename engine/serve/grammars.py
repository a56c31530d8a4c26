"""Compiled grammars kept for the requests that bring them again (a message and its plain comparison, a class
given one schema): each is compiled once, on the thread of the request that first brings it, never on the
engine's; the engine thread then only copies the starting matcher.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

from engine.grammar import GrammarSpec

GRAMMARS_KEPT = 16  # compiled grammars kept, the latest used last


class GrammarCache:
    def __init__(self, tokenizer: Callable[[], object], kept: int = GRAMMARS_KEPT):
        self.tokenizer = tokenizer  # the target's grammar tokenizer, built on first need (Engine.grammar_tokenizer)
        self.kept = kept
        self.compiled: OrderedDict[tuple[str, str], GrammarSpec] = OrderedDict()  # (kind, text) -> compiled spec
        self.lock = threading.Lock()  # callers compile on their own threads

    def prepare(self, spec: GrammarSpec) -> None:
        """Compile `spec` within its time limit, or take what an earlier request with the same grammar
        compiled. Raises ValueError with the reason."""
        key = (spec.kind, spec.text)
        with self.lock:
            known = self.compiled.get(key)
            if known is not None:
                self.compiled.move_to_end(key)
        if known is not None:
            spec.share_from(known)
            return
        spec.prepare(self.tokenizer())
        with self.lock:
            self.compiled[key] = spec
            while len(self.compiled) > self.kept:
                self.compiled.popitem(last=False)
