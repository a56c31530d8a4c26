"""ngram-cache: llama.cpp's n-gram frequency caches (common/ngram-cache.cpp, lookup decoding).

A cache maps an n-gram (1 to 4 tokens) to counts of the tokens seen right after it. Three caches are consulted:
the context cache, built from the sequence itself; an optional dynamic cache; an optional static cache, keyed by
2-grams, that also re-weights the candidates of the other two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.draft.base import Drafter, DraftRequest
from engine.draft.ngram import clip_draft

CacheTable = dict[tuple[int, ...], dict[int, int]]  # n-gram -> {next token: count}

NGRAM_MAX = 4  # llama.cpp's LLAMA_NGRAM_MAX: the file format and the threshold tables are this wide
NGRAM_STATIC = 2  # llama.cpp's LLAMA_NGRAM_STATIC: n-gram size of the static cache
TOKEN_NULL = -1  # pads an n-gram shorter than NGRAM_MAX in the file format

# Per n-gram size 1..4, a candidate needs this many samples and this share (%) of them (draft_min_*_lax/strict)
LAX_MIN_SAMPLES = (2, 2, 1, 1)
LAX_MIN_PERCENT = (66, 50, 50, 50)
STRICT_MIN_SAMPLES = (4, 3, 2, 2)
STRICT_MIN_PERCENT = (75, 66, 66, 66)


def update_cache(cache: CacheTable, tokens: list[int], n_new: int, ngram_min: int, ngram_max: int) -> None:
    """Count the last n_new tokens of `tokens` after each n-gram (sizes ngram_min..ngram_max) that precedes them."""
    for i in range(max(len(tokens) - n_new, 0), len(tokens)):
        token = tokens[i]
        for size in range(ngram_min, min(ngram_max, i) + 1):
            part = cache.setdefault(tuple(tokens[i - size : i]), {})
            part[token] = part.get(token, 0) + 1


def load_cache(path: str | Path) -> CacheTable:
    """Read a cache in llama.cpp's binary format (common_ngram_cache_save): little-endian int32 records of
    4 n-gram tokens padded with -1, the number of entries, then (token, count) pairs."""
    words = np.fromfile(path, dtype="<i4")
    cache: CacheTable = {}
    pos = 0
    while pos < words.size:
        key = tuple(int(t) for t in words[pos : pos + NGRAM_MAX] if t != TOKEN_NULL)
        n_entries = int(words[pos + NGRAM_MAX])
        pairs = words[pos + NGRAM_MAX + 1 : pos + NGRAM_MAX + 1 + 2 * n_entries].reshape(-1, 2)
        cache[key] = {int(t): int(c) for t, c in pairs}
        pos += NGRAM_MAX + 1 + 2 * n_entries
    return cache


def save_cache(cache: CacheTable, path: str | Path) -> None:
    """Write a cache in llama.cpp's binary format, readable by load_cache and by llama.cpp."""
    words: list[int] = []
    for key, part in cache.items():
        words += list(key) + [TOKEN_NULL] * (NGRAM_MAX - len(key)) + [len(part)]
        for token, count in part.items():
            words += [token, count]
    np.asarray(words, dtype="<i4").tofile(path)


def best_candidate(part: dict[int, int], part_static: dict[int, int]) -> tuple[int, int, int]:
    """(token, its count, total count) where the token maximises count x static weight; first seen wins ties."""
    best, best_count, best_score, total = TOKEN_NULL, 0, 0, 0
    for token, count in part.items():
        score = count * (100 * part_static[token] if token in part_static else 1)
        if score > best_score:
            best, best_count, best_score = token, count, score
        total += count
    return best, best_count, total


def try_primary(cache: CacheTable, ngrams: list[tuple[int, ...]], part_static: dict[int, int],
                min_samples: tuple[int, ...], min_percent: tuple[int, ...]) -> int:
    """Draft one token from the context or dynamic cache, longest n-gram first; TOKEN_NULL if none qualifies."""
    for ngram in reversed(ngrams):
        part = cache.get(ngram)
        if not part:
            continue
        token, count, total = best_candidate(part, part_static)
        size = len(ngram) - 1
        if total >= min_samples[size] and 100 * count >= min_percent[size] * total:
            return token
    return TOKEN_NULL


def try_static(cache: CacheTable, ngram: tuple[int, ...]) -> int:
    """Draft one token from the static cache alone (lax thresholds of its n-gram size)."""
    part = cache.get(ngram)
    if not part:
        return TOKEN_NULL
    token, count, total = best_candidate(part, {})
    size = NGRAM_STATIC - 1
    if total < LAX_MIN_SAMPLES[size] or 100 * count < LAX_MIN_PERCENT[size] * total:
        return TOKEN_NULL
    return token


def token_at(prompt: list[int], extra: list[int], i: int) -> int:
    """Token i of prompt + extra, without building the concatenation."""
    return prompt[i] if i < len(prompt) else extra[i - len(prompt)]


def pick_cache(given: CacheTable | None, path: str) -> CacheTable:
    if given is not None:
        return given
    return load_cache(path) if path else {}


@dataclass
class NgramCacheParams:
    n_draft: int = 8  # tokens per draft (llama.cpp hard-codes n_draft = 8)
    ngram_min: int = 1  # smallest n-gram counted (LLAMA_NGRAM_MIN)
    ngram_max: int = 4  # largest n-gram counted (LLAMA_NGRAM_MAX); at most 4
    lookup_cache_static: str = ""  # path of a static cache file (--lookup-cache-static); "" for none
    lookup_cache_dynamic: str = ""  # path of a dynamic cache file (--lookup-cache-dynamic); "" for none


@dataclass
class ContextCache:
    """Counts over the sequence's confirmed tokens, prompt + id_last; append-only."""

    counts: CacheTable = field(default_factory=dict)
    n_counted: int = 0  # tokens of prompt + [id_last] already counted
    tail: int = TOKEN_NULL  # the last of them: tells a history that was replaced from one that grew


@dataclass
class CacheSeqState:
    context: ContextCache = field(default_factory=ContextCache)


class NgramCache(Drafter):
    """ngram-cache: draft greedily, one token at a time, from n-gram -> next-token counts.

    llama.cpp (common_speculative_impl_ngram_cache, common_ngram_cache_draft): per sequence, the context cache is
    updated with the new tokens + id_last before each draft (only n-grams inside that new chunk are counted).
    Each step builds the n-grams of sizes 1..4 ending at the draft's tip and takes the first token that passes,
    longest n-gram first: context cache with lax thresholds, then dynamic with strict ones, then the static
    2-gram cache alone; candidates are scored count x (100 x static count, or 1). Up to 8 tokens; no state in
    begin/accept. Static and dynamic caches are loaded from files and never updated during generation.
    Ours: begin() counts the prompt already; the update also counts n-grams that straddle the previous chunk
    (llama.cpp loses those); the history is rebuilt when it shrinks or changes; thresholds are indexed by size
    (llama.cpp by position in the size list, the same for ngram_min = 1); ties go to the first token seen.
    With a static or dynamic cache a draft can hold tokens that are not in the sequence's history.
    """

    name = "ngram-cache"

    def __init__(self, params: NgramCacheParams | None = None,
                 static_cache: CacheTable | None = None, dynamic_cache: CacheTable | None = None) -> None:
        self.params = params or NgramCacheParams()
        if not 1 <= self.params.ngram_min <= self.params.ngram_max <= NGRAM_MAX:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max <= {NGRAM_MAX}")
        # read-only and shared by every sequence (llama.cpp gives each sequence a copy it never changes)
        self.static_cache = pick_cache(static_cache, self.params.lookup_cache_static)
        self.dynamic_cache = pick_cache(dynamic_cache, self.params.lookup_cache_dynamic)
        self._seqs: dict[int, CacheSeqState] = {}

    def begin(self, seq: int, prompt: list[int]) -> None:
        state = self._seqs[seq] = CacheSeqState()
        self._catch_up(state, prompt, [])  # llama.cpp counts at the first draft; the result is the same

    def draft(self, requests: list[DraftRequest]) -> None:
        for req in requests:
            state = self._seqs.setdefault(req.seq, CacheSeqState())
            self._catch_up(state, req.prompt, [req.id_last])
            n_draft = min(self.params.n_draft, req.draft_max)  # greedy: a shorter draft is a prefix of a longer one
            tip = req.prompt[-NGRAM_MAX:] + [req.id_last]
            req.result = clip_draft(self._draft_tokens(state.context.counts, tip, n_draft), req)

    def seq_rm(self, seq: int) -> None:
        self._seqs.pop(seq, None)

    def _catch_up(self, state: CacheSeqState, prompt: list[int], extra: list[int]) -> None:
        """Count the tokens of prompt + extra that the context cache has not seen yet."""
        ctx = state.context
        n_total = len(prompt) + len(extra)
        if ctx.n_counted and (n_total < ctx.n_counted or token_at(prompt, extra, ctx.n_counted - 1) != ctx.tail):
            ctx = state.context = ContextCache()
        n_new = n_total - ctx.n_counted
        if n_new <= 0:
            return
        # the new tokens plus enough earlier ones to complete the n-grams that end at them
        tokens = prompt[max(0, ctx.n_counted - self.params.ngram_max) :] + extra
        update_cache(ctx.counts, tokens, n_new, self.params.ngram_min, self.params.ngram_max)
        ctx.n_counted = n_total
        ctx.tail = tokens[-1]

    def _draft_tokens(self, context: CacheTable, tip: list[int], n_draft: int) -> list[int]:
        p = self.params
        drafted: list[int] = []
        if len(tip) < NGRAM_STATIC:
            return drafted
        while len(drafted) < n_draft:
            ngram_static = tuple(tip[-NGRAM_STATIC:])
            part_static = self.static_cache.get(ngram_static, {})
            ngrams = [tuple(tip[-size:]) for size in range(p.ngram_min, min(p.ngram_max, len(tip)) + 1)]
            token = try_primary(context, ngrams, part_static, LAX_MIN_SAMPLES, LAX_MIN_PERCENT)
            if token == TOKEN_NULL:
                token = try_primary(self.dynamic_cache, ngrams, part_static, STRICT_MIN_SAMPLES, STRICT_MIN_PERCENT)
            if token == TOKEN_NULL:
                token = try_static(self.static_cache, ngram_static)
            if token == TOKEN_NULL:
                break
            drafted.append(token)
            tip.append(token)
        return drafted
