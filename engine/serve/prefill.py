"""Prompts into the memory: a chunk a step, between the other slots' rounds, and the tokens a resumed slot lost.

A prompt is forwarded `N_BATCH` rows at a time when nothing else generates; while other slots answer, every
prompt in prefill draws from one allowance of `N_BATCH_BESIDE` rows a step, so their rounds run between its
chunks and several prompts arriving together hold those streams for one chunk's time, as llama-server splits a
prompt into `n_ubatch` pieces and schedules other slots' tokens beside them (tools/server/server-context.cpp).
Every chunk but the last asks the LM head for no row; the last one's logits give the answer's first token, and
the prefill's event (round 0) comes with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from engine.batch import Batch
from engine.events import ErrorEvent, failure
from engine.round.event_builder import Decision, Emission, SlotRound, Timing
from engine.round.slot import Slot
from engine.sampling import entropy_bits

N_BATCH = 512  # rows per forward: prompt chunks during prefill, and the cap on logits rows of a verification
# a step's prompt rows in all while other slots are generating: bounds how long prompts in prefill hold their
# streams (llama-server's n_ubatch interleaving, by alternation)
N_BATCH_BESIDE = 128


@dataclass
class Prefiller:
    ctx: object  # the target's context: its forward and memory
    chain: object  # the DrafterChain: its drafters hear every forwarded token (n-gram tables, the head's features)
    emit: Callable[[Slot, list[int]], Emission]  # gives the first answer token to the user

    def step(self, slots: list[Slot], beside: bool, whole: bool) -> tuple[list[SlotRound | ErrorEvent], set[int]]:
        """A chunk of each prompt in prefill (in slot order, while the step's allowance lasts; `whole`: all of
        each prompt, for step mode) and the lost tokens of resumed slots. Returns the records of the events
        (engine/round/event_builder.py) and the slots prefilled in this step, which draft from the next one on."""
        events: list[SlotRound | ErrorEvent] = []
        prefilled: set[int] = set()
        n_rows_left = N_BATCH_BESIDE if beside and not whole else None
        for slot in [s for s in slots if s.state == "prefill"]:
            if n_rows_left is not None and n_rows_left <= 0:
                break
            try:
                n_before = len(slot.tokens)
                ev = self.chunk(slot, n_rows_left if n_rows_left is not None else N_BATCH)
                while ev is None and whole:
                    ev = self.chunk(slot, N_BATCH)
                if n_rows_left is not None:
                    n_rows_left -= len(slot.tokens) - n_before
                if ev is not None:
                    events.append(ev)
            except Exception as e:  # one prompt that breaks the model must not end the other chats
                events.append(failure(slot.seq, "prefill", e))
            prefilled.add(slot.seq)
        for slot in [s for s in slots if s.refill]:
            try:
                self.refill(slot)
            except Exception as e:
                events.append(failure(slot.seq, "refill", e))
                prefilled.add(slot.seq)
        return events, prefilled

    def chunk(self, slot: Slot, n_rows: int) -> SlotRound | None:
        """Forward the prompt's next chunk of at most n_rows; the prefill's round once the last one ran (the
        first answer token sampled from its logits), else None."""
        t0 = time.perf_counter()
        todo = slot.prompt[len(slot.tokens):]
        if not todo:
            raise RuntimeError("prefill with no prompt token left to forward")
        chunk = todo[:n_rows]
        last = len(chunk) == len(todo)
        batch = Batch()
        for i, tok in enumerate(chunk):
            batch.add(tok, len(slot.tokens) + i, slot.seq, last and i == len(chunk) - 1)
        res = self.ctx.decode(batch)
        self.chain.process(batch, res)
        slot.tokens.extend(chunk)
        slot.prefill_rows += len(chunk)
        slot.prefill_ms += (time.perf_counter() - t0) * 1e3
        return self.first_token(slot, res.logits[-1]) if last else None

    def first_token(self, slot: Slot, logits) -> SlotRound:
        """The answer's first token from the prompt's last row: the prefill's round (round 0)."""
        t0 = time.perf_counter()
        row = logits if slot.grammar is None else slot.grammar.mask(logits)
        tok = slot.sampler.sample(row)
        p = float(slot.sampler.probs(row)[tok])
        if slot.grammar is not None:
            slot.grammar.consume(tok)
        slot.id_last = tok
        slot.state = "generating"
        decided = Decision(seq=slot.seq, round=0, kind="prefill", drafter=None, pos_sampled=len(slot.tokens) - 1,
                       p0=len(slot.tokens), bonus=tok, p_target=[p], notes=list(slot.notes),
                       entropy=entropy_bits(logits.reshape(1, -1)) if slot.params.explain else [])
        timing = Timing(t_verify_ms=slot.prefill_ms + (time.perf_counter() - t0) * 1e3, batch_rows=slot.prefill_rows)
        slot.round = 1
        return SlotRound(decided, self.emit(slot, [tok]), timing)

    def refill(self, slot: Slot) -> None:
        """Forward the confirmed tokens a resumed slot lost from the cache; nothing is sampled."""
        for start in range(0, len(slot.refill), N_BATCH):
            chunk = slot.refill[start:start + N_BATCH]
            batch = Batch()
            for i, tok in enumerate(chunk):
                batch.add(tok, len(slot.tokens) + i, slot.seq, i == len(chunk) - 1)
            self.chain.process(batch, self.ctx.decode(batch))
            slot.tokens.extend(chunk)
        slot.refill = []
