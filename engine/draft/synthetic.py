"""A drafter for synthetic-acceptance measurements: always proposes n_max tokens.

With `SpecParams.synthetic_accept = P` the engine keeps each draft token with probability P whatever it is
(llama.cpp's synthetic acceptance), so what is drafted does not matter, only that a full-length draft exists
every round: the speed-versus-acceptance curve can then be measured at a fixed k and laid over the
formula speedup = (1 - a^(k+1)) / ((1 - a)(c + 1)). It proposes the context's last tokens again, which costs nothing to compute.
"""

from __future__ import annotations

from engine.draft.base import Drafter, DraftRequest


class SyntheticDrafter(Drafter):
    name = "synthetic"

    def draft(self, requests: list[DraftRequest]) -> None:
        for r in requests:
            history = r.prompt + [r.id_last]
            r.result = [history[(len(history) - r.draft_max + i) % len(history)] for i in range(r.draft_max)]
            r.result_p = [0.0] * r.draft_max
