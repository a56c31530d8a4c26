"""History-lookup drafters after llama.cpp's common/ngram-map.cpp: ngram-simple, ngram-map-k, ngram-map-k4v.

All three copy a continuation out of the sequence's own confirmed history (prompt + id_last), so a draft never
holds a token the sequence has not seen. None of them runs a model: `process` is a no-op.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.draft.base import Drafter, DraftRequest

MAX_VALUES = 4  # llama.cpp's COMMON_NGRAM_MAX_VALUES: m-grams tracked per key by k4v


def clip_draft(draft: list[int], req: DraftRequest) -> list[int]:
    """Cap a draft at the request's n_max, then drop it when shorter than its n_min (and when empty)."""
    if req.draft_max <= 0:
        return []
    draft = draft[: req.draft_max]
    return draft if len(draft) >= max(req.n_min, 1) else []


def latest_match(hist: np.ndarray, pattern: list[int], last_start: int) -> int:
    """Largest j <= last_start with hist[j:j+len(pattern)] == pattern, or -1."""
    if last_start < 0:
        return -1
    count = last_start + 1
    ok = hist[:count] == pattern[0]
    for k in range(1, len(pattern)):
        ok &= hist[k : k + count] == pattern[k]
    hits = np.flatnonzero(ok)
    return int(hits[-1]) if hits.size else -1


@dataclass
class NgramSimpleParams:
    size_n: int = 12  # length of the lookup n-gram (--spec-ngram-size-n)
    size_m: int = 48  # length of the drafted m-gram (--spec-ngram-size-m)
    window: int = 4096  # ours: search only this many recent tokens; llama.cpp scans the whole history
    # ours: where the size_n key has no earlier occurrence, shorter keys down to this size are tried (as
    # transformers' prompt lookup goes from 2 tokens down to 1); None keeps llama.cpp's single size
    size_n_min: int | None = None


class NgramSimple(Drafter):
    """ngram-simple: copy what followed the latest earlier occurrence of the current n-gram.

    llama.cpp (common_ngram_simple_draft): the pattern is the last n-1 prompt tokens + id_last; it needs more than
    n + m + 1 tokens of history, scans backwards from cur_len - n - 1 for the most recent match and copies at most
    m tokens that follow it inside the prompt; when fewer than n tokens follow the match it gives no draft (it
    names n "n_draft_min"). Stateless; begin/process/accept are no-ops.
    Ours: the scan is vectorised over the last `window` tokens only, and position 0 may match (llama.cpp skips
    it, using 0 as "no match"); the request's n_max/n_min are applied here rather than by the chain. With
    size_n_min below size_n, a key with no match gives way to the next shorter one: an answer that changed one
    word of the text it copies finds its source again one token after the change instead of size_n tokens after.
    """

    name = "ngram-simple"

    def __init__(self, params: NgramSimpleParams | None = None) -> None:
        self.params = params or NgramSimpleParams()

    def draft(self, requests: list[DraftRequest]) -> None:
        for req in requests:
            req.result = clip_draft(self.lookup(req.prompt, req.id_last), req)

    def lookup(self, prompt: list[int], id_last: int) -> list[int]:
        n, m = self.params.size_n, self.params.size_m
        cur_len = len(prompt)
        if cur_len <= n + m + 1:
            return []
        start = max(0, cur_len - self.params.window)
        hist = np.asarray(prompt[start:], dtype=np.int64)
        n_min = n if self.params.size_n_min is None else max(1, min(self.params.size_n_min, n))
        for size in range(n, n_min - 1, -1):
            pattern = prompt[cur_len - size + 1 :] + [id_last]
            # a match must end before the last prompt token so that at least one token follows it
            j = latest_match(hist, pattern, hist.size - size - 1)
            if j < 0:
                continue
            begin = start + j + size
            n_copy = min(m, cur_len - begin)
            # llama.cpp: fewer tokens after the latest match than the key is long -> no draft at all
            return prompt[begin : begin + n_copy] if n_copy >= size else []
        return []


@dataclass
class NgramMapParams:
    size_n: int = 12  # key length (--spec-ngram-size-n)
    size_m: int = 48  # value length, the longest draft (--spec-ngram-size-m)
    min_hits: int = 1  # earlier occurrences of the key needed before it drafts (--spec-ngram-min-hits)


@dataclass(slots=True)
class KeyStats:
    count: int = 0  # occurrences of the key that are followed by a full m-gram
    last: int = -1  # start of the latest such occurrence
    values: dict[tuple[int, ...], int] = field(default_factory=dict)  # k4v: first 4 distinct m-grams -> count


@dataclass
class MapIndex:
    """Key n-gram -> statistics over the confirmed history; append-only, grown a few positions per round."""

    keys: dict[tuple[int, ...], KeyStats] = field(default_factory=dict)
    n_done: int = 0  # key start positions below this are indexed
    n_seen: int = 0  # prompt length at the last catch-up
    tail: int = -1  # prompt[n_seen - 1] then: tells a history that was replaced from one that grew


@dataclass
class MapSeqState:
    index: MapIndex = field(default_factory=MapIndex)
    n_accepted: dict[tuple, int] = field(default_factory=dict)  # key, or (key, value) for k4v -> last accepted
    last_used: tuple | None = None  # what the last draft came from, for accept()


def dominant_value(values: dict[tuple[int, ...], int]) -> tuple[int, ...] | None:
    """The most frequent m-gram when it is at least twice as frequent as all the others together."""
    if not values:
        return None
    best = max(values, key=values.__getitem__)  # the first seen wins a tie, like llama.cpp's slot order
    others = sum(values.values()) - values[best]
    if others > 0 and values[best] < 2 * others:
        return None
    return best


class NgramMapK(Drafter):
    """ngram-map-k: a map from key n-grams of the confirmed history to where they occurred.

    llama.cpp (common_ngram_map_draft, key_only): the key is the last n-1 prompt tokens + id_last; it is looked up
    among occurrences that start at or before cur_len - n - m - 1 (a 2^18-slot hash of positions, then linear
    scans), and the m tokens after the match are drafted, cut to the number the target accepted the last time
    this key drafted (common_ngram_map_accept; starts at m, so a key once accepted 0 times stops drafting).
    Its key_num counts draft calls that hit the key, and key_only mode never reads min_hits.
    Ours: a dict indexes every key occurrence once; we copy after the latest occurrence (llama.cpp's hash slot
    keeps the first one it indexed); min_hits counts earlier occurrences of the key and applies to map-k too,
    as llama.cpp's docs/speculative.md describes; begin() rebuilds the index instead of pruning it.
    """

    name = "ngram-map-k"
    key_only = True

    def __init__(self, params: NgramMapParams | None = None) -> None:
        self.params = params or NgramMapParams()
        self._seqs: dict[int, MapSeqState] = {}

    def begin(self, seq: int, prompt: list[int]) -> None:
        state = self._seqs[seq] = MapSeqState()
        self._catch_up(state, prompt)

    def draft(self, requests: list[DraftRequest]) -> None:
        for req in requests:
            state = self._seqs.setdefault(req.seq, MapSeqState())
            self._catch_up(state, req.prompt)
            req.result = clip_draft(self._lookup(state, req.prompt, req.id_last, req.tree_max > 0), req)
            if not req.result:
                state.last_used = None
            elif req.tree_max > 0:
                alts = self.alternatives(state, req.prompt, req.id_last)
                share = {tuple(v): w for v, w in alts}
                req.result_share = share.get(state.last_used[1], 1.0) if alts else 1.0
                req.result_alts = [(v, w) for v, w in alts if tuple(v) != state.last_used[1]]

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        state = self._seqs.get(seq)
        if is_other or state is None or state.last_used is None:
            return
        state.n_accepted[state.last_used] = n_accepted

    def seq_rm(self, seq: int) -> None:
        self._seqs.pop(seq, None)

    def _catch_up(self, state: MapSeqState, prompt: list[int]) -> None:
        index = state.index
        if len(prompt) < index.n_seen or (index.n_seen and prompt[index.n_seen - 1] != index.tail):
            index = state.index = MapIndex()
        n, m = self.params.size_n, self.params.size_m
        # llama.cpp's bound: a key counts once its m-gram and one more token are in the prompt
        stop = len(prompt) - n - m
        for j in range(index.n_done, stop):
            key = tuple(prompt[j : j + n])
            stats = index.keys.get(key)
            if stats is None:
                stats = index.keys[key] = KeyStats()
            stats.count += 1
            stats.last = j
            if not self.key_only:
                self._count_value(stats, tuple(prompt[j + n : j + n + m]))
        index.n_done = max(index.n_done, stop)
        index.n_seen = len(prompt)
        index.tail = prompt[-1] if prompt else -1

    @staticmethod
    def _count_value(stats: KeyStats, value: tuple[int, ...]) -> None:
        if value in stats.values:
            stats.values[value] += 1
        elif len(stats.values) < MAX_VALUES:
            stats.values[value] = 1

    def _lookup(self, state: MapSeqState, prompt: list[int], id_last: int, req_tree: bool = False) -> list[int]:
        n, m = self.params.size_n, self.params.size_m
        state.last_used = None
        if len(prompt) < n - 1:
            return []
        key = tuple(prompt[len(prompt) - n + 1 :]) + (id_last,)
        stats = state.index.keys.get(key)
        if stats is None or stats.count < self.params.min_hits:
            return []
        if self.key_only:
            value = tuple(prompt[stats.last + n : stats.last + n + m])
            used: tuple = key
        else:
            value = dominant_value(stats.values)
            if value is None and req_tree:
                value = max(stats.values, key=stats.values.__getitem__)  # a tree checks the others beside it
            if value is None:
                return []
            used = (key, value)
        state.last_used = used
        return list(value[: min(m, state.n_accepted.get(used, m))])

    def alternatives(self, state: MapSeqState, prompt: list[int], id_last: int) -> list[tuple[list[int], float]]:
        """Tree mode: every value of the key with its share of the key's count, most frequent first (k4v keeps
        up to MAX_VALUES; key-only map-k keeps the latest occurrence only, so it has none)."""
        n = self.params.size_n
        if self.key_only or len(prompt) < n - 1:
            return []
        stats = state.index.keys.get(tuple(prompt[len(prompt) - n + 1:]) + (id_last,))
        if stats is None or stats.count < self.params.min_hits:
            return []
        total = sum(stats.values.values())
        ranked = sorted(stats.values.items(), key=lambda kv: -kv[1])
        return [(list(v), c / total) for v, c in ranked]


class NgramMapK4V(NgramMapK):
    """ngram-map-k4v: like ngram-map-k, but each key keeps up to 4 distinct m-grams (values) with counts.

    llama.cpp (common_ngram_map_draft, key_only=false): counts the first 4 distinct m-grams seen after the key,
    needs key_num >= min_hits, and drafts only when the most frequent value is at least twice the sum of the
    others; the adaptive length (last accepted count) is kept per value. It then copies the tokens after the
    matched position, whatever value follows there, not necessarily the winning one.
    Ours: drafts the winning value's own tokens (what the statistics chose); min_hits counts occurrences.
    """

    name = "ngram-map-k4v"
    key_only = False
