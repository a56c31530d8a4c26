"""ngram-mod: llama.cpp's fixed-size hashed n-gram pool (common/ngram-mod.cpp, common_speculative_impl_ngram_mod)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.draft.base import Drafter, DraftRequest
from engine.draft.ngram import clip_draft

EMPTY = -1  # a pool slot that holds no token
LCG_MUL = 6364136223846793005  # llama.cpp's multiplier: hash = hash * LCG_MUL + token, mod 2^64
MASK64 = (1 << 64) - 1


@dataclass
class NgramModParams:
    n_match: int = 24  # length of the hashed n-gram (--spec-ngram-mod-n-match); below 16 drafts are noisy
    n_max: int = 64  # pool lookups per draft (--spec-ngram-mod-n-max)
    n_min: int = 48  # a lookup chain that misses before this many tokens gives no draft (--spec-ngram-mod-n-min)
    pool_size: int = 1 << 20  # slots in the pool; llama.cpp: 4*1024*1024
    shared_pool: bool = False  # llama.cpp: True, one pool for every sequence; ours: one pool per sequence
    chunk: int = 32  # new confirmed tokens are indexed once more than this many are pending
    max_occupancy: float = 0.25  # begin() empties a pool fuller than this
    low_acceptance: float = 0.25  # accept() counts a round whose accepted fraction is below this as low
    low_rounds: int = 5  # this many low rounds in a row empty the pool


class ModPool:
    """Slot hash(n-gram) -> the token that followed it last; collisions simply overwrite."""

    def __init__(self, n: int, size: int) -> None:
        self.n = n
        self.entries = np.full(size, EMPTY, dtype=np.int32)
        self.used = 0  # slots that are not EMPTY
        self.mul_top = pow(LCG_MUL, n - 1, 1 << 64)  # weight of the oldest token in a window's hash

    def reset(self) -> None:
        self.entries.fill(EMPTY)
        self.used = 0

    def occupancy(self) -> float:
        return self.used / self.entries.size

    def add(self, tokens: list[int], start: int, stop: int) -> None:
        """Index the windows tokens[i:i+n] -> tokens[i+n] for start <= i < stop."""
        count = stop - start
        if count <= 0:
            return
        seg = np.asarray(tokens[start : stop + self.n], dtype=np.uint64)
        hashes = np.zeros(count, dtype=np.uint64)
        for k in range(self.n):  # numpy uint64 arithmetic wraps mod 2^64 like llama.cpp's size_t
            hashes = hashes * np.uint64(LCG_MUL) + seg[k : k + count]
        slots = hashes % np.uint64(self.entries.size)
        fresh = slots[self.entries[slots] == EMPTY]
        self.used += int(np.unique(fresh).size)
        self.entries[slots] = seg[self.n : self.n + count].astype(np.int32)  # a repeated slot keeps the last

    def chain(self, window: list[int], n_max: int) -> list[int]:
        """Look up the token after `window` (n tokens), append it, slide, repeat: at most n_max tokens."""
        h = 0
        for t in window:
            h = (h * LCG_MUL + t) & MASK64
        seq = list(window)
        size = self.entries.size
        for i in range(n_max):
            token = int(self.entries[h % size])
            if token == EMPTY:
                break
            seq.append(token)
            h = ((h - seq[i] * self.mul_top) * LCG_MUL + token) & MASK64
        return seq[self.n :]


@dataclass
class ModSeqInfo:
    i_last: int = 0  # windows starting below this are in the pool
    n_draft_last: int = 0  # length of the last draft returned, for the acceptance fraction
    n_low: int = 0  # consecutive low-acceptance rounds


class NgramMod(Drafter):
    """ngram-mod: a fixed-size pool mapping hash(last n tokens) -> next token, walked to draft.

    llama.cpp: one 4M-slot pool shared by all sequences; begin() adds every n-gram of the prompt, then empties
    the pool when more than 25% of it is used; draft_one() first catches up on confirmed tokens, but only once
    i_last + 32 < cur_len, then hashes the last n-1 prompt tokens + id_last, looks up a token, slides the window
    over it and repeats up to n_max times; a miss before n_min tokens gives no draft. accept() ignores is_other
    and, after 5 rounds in a row with accepted/drafted < 0.25, empties the pool and sets i_last = 0 (the next
    catch-up re-indexes the whole history). The chain truncates the draft to the request's n_max afterwards.
    Ours: by default each sequence has its own pool (set shared_pool for llama.cpp's), emptied by begin(), so a
    draft only holds that sequence's tokens; the pool is a numpy array of 1M slots; the request's n_max/n_min
    are applied after the pool's own n_min/n_max, and n_draft_last is the length actually returned.
    """

    name = "ngram-mod"

    def __init__(self, params: NgramModParams | None = None) -> None:
        self.params = params or NgramModParams()
        self._seqs: dict[int, ModSeqInfo] = {}
        self._pools: dict[int | None, ModPool] = {}  # per sequence, or one under None when shared

    def pool_used(self, seq: int) -> int:
        """Occupied slots of the pool `seq` drafts from (0 if it has none)."""
        pool = self._pools.get(self._pool_key(seq))
        return pool.used if pool is not None else 0

    def begin(self, seq: int, prompt: list[int]) -> None:
        pool = self._pool(seq)
        if not self.params.shared_pool:
            pool.reset()  # a new prompt: forget what an earlier prompt of this slot taught
        info = self._seqs[seq] = ModSeqInfo()
        n = self.params.n_match
        if len(prompt) < n:
            return
        pool.add(prompt, 0, len(prompt) - n)
        info.i_last = len(prompt) - n
        if pool.occupancy() > self.params.max_occupancy:
            pool.reset()  # a crowded pool mostly returns collisions

    def draft(self, requests: list[DraftRequest]) -> None:
        for req in requests:
            info = self._seqs.setdefault(req.seq, ModSeqInfo())
            req.result = clip_draft(self._draft_one(info, req), req)
            info.n_draft_last = len(req.result)

    def _draft_one(self, info: ModSeqInfo, req: DraftRequest) -> list[int]:
        p = self.params
        prompt, cur_len, n = req.prompt, len(req.prompt), p.n_match
        if cur_len < n:
            return []
        pool = self._pool(req.seq)
        if info.i_last + p.chunk < cur_len:  # batch the catch-up: one numpy pass per chunk, not per round
            pool.add(prompt, info.i_last, cur_len - n)
            info.i_last = cur_len - n
        drafted = pool.chain(prompt[cur_len - n + 1 :] + [req.id_last], p.n_max)
        if len(drafted) < min(p.n_min, p.n_max):
            return []
        return drafted

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        info = self._seqs.get(seq)
        if is_other or info is None or info.n_draft_last <= 0:
            return
        if n_accepted / info.n_draft_last >= self.params.low_acceptance:
            info.n_low = 0
            return
        info.n_low += 1
        if info.n_low >= self.params.low_rounds:
            self._pool(seq).reset()
            info.n_low = 0
            info.i_last = 0

    def seq_rm(self, seq: int) -> None:
        self._seqs.pop(seq, None)
        if not self.params.shared_pool:
            self._pools.pop(seq, None)

    def _pool_key(self, seq: int) -> int | None:
        return None if self.params.shared_pool else seq

    def _pool(self, seq: int) -> ModPool:
        key = self._pool_key(seq)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ModPool(self.params.n_match, self.params.pool_size)
        return pool
