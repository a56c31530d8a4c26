"""The oracle: a drafter that already knows the answer, the ceiling the arena ranks real drafters under.

A measurement that has run the prompt once with plain decoding knows the target's own answer; given it
(`SpecParams.reference`, the whole sequence: prompt then answer) the oracle proposes the next n_max tokens of it
after the confirmed ones. At temperature 0 every one of them is the target's argmax, so every draft is kept
whole and a round emits n_max + 1 tokens: what perfect drafting would give on this engine, at this draft length.
It never drafts off its reference: once the confirmed tokens part from it (another seed, a temperature that
draws otherwise) it proposes nothing rather than a guess, so it stays lossless whatever it is given.
"""

from __future__ import annotations

from engine.draft.base import Drafter, DraftRequest

# the confirmed tokens are matched against the reference over this many last positions: a check of the whole
# history would cost time that grows with the answer, and is charged to the oracle's drafting
TAIL = 64


class OracleDrafter(Drafter):
    name = "oracle"

    def __init__(self):
        self.expected: dict[int, list[int]] = {}  # seq -> the whole sequence it should produce (prompt + answer)

    def expect(self, seq: int, reference: list[int] | None) -> None:
        if reference is None:
            self.expected.pop(seq, None)
        else:
            self.expected[seq] = list(reference)

    def draft(self, requests: list[DraftRequest]) -> None:
        for r in requests:
            ref = self.expected.get(r.seq)
            if ref is None:
                continue
            n = len(r.prompt) + 1  # confirmed tokens with the one sampled last round
            tail = r.prompt[-(TAIL - 1):] + [r.id_last]
            if n > len(ref) or ref[n - len(tail):n] != tail:
                continue  # off the reference: no proposal rather than a wrong one
            r.result = ref[n:n + r.draft_max]
            r.result_p = [1.0] * len(r.result)

    def seq_rm(self, seq: int) -> None:
        self.expected.pop(seq, None)
