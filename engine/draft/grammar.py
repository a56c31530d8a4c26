"""The `grammar` drafter: the tokens a constrained generation's grammar forces next, offered as a draft.

Where the grammar leaves one way on (a JSON key the schema requires next, the `":` after it, a closing brace),
its matcher knows the bytes that must come and one tokenisation of them (llguidance's compute_ff_tokens). They
cost no model call to draft, and the target keeps them whenever it would have produced the same tokenisation,
which under the grammar's mask is usually its only high-probability choice. The target still verifies them as
it verifies any draft: a grammar can force bytes without forcing their tokenisation, so a forced token is not
certain to be the target's token.

How it sees the grammar: the round gives every request a read-only view of the slot's grammar state after
id_last (`DraftRequest.grammar`, engine/grammar.py's GrammarView). A view rather than the matcher itself, since
drafting runs before verification and the verification's masks are read from that very state; and a view
rather than the forced tokens precomputed by the round, so slots that do not ask for this drafter pay nothing.
"""

from __future__ import annotations

from engine.draft.base import Drafter, DraftRequest


class GrammarDrafter(Drafter):
    name = "grammar"

    def draft(self, requests: list[DraftRequest]) -> None:
        for r in requests:
            if r.grammar is None:
                continue  # an unconstrained generation: nothing is forced, the next drafter is asked
            # no q: a forced token has no draft distribution to speak of, so the round verifies it by matching
            # (sample-and-match), which keeps the output exact at any temperature
            r.result = r.grammar.forced()[: r.draft_max]
