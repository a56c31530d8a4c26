"""The longest common prefix of two token lists: how much of a cache can be kept when its owner moves on.

Every cache in the engine keeps tokens in position order (the target's slots, a draft model's cells, the draft
head's KV entries), so "what of it still agrees with the confirmed tokens" is always this one question.
"""

from __future__ import annotations

from typing import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """Number of leading tokens `a` and `b` share, at most `limit` (callers that must forward the last
    confirmed token again, for its logits, pass `len(confirmed) - 1`)."""
    n_max = min(len(a), len(b)) if limit is None else max(0, min(len(a), len(b), limit))
    if a[:n_max] == b[:n_max]:  # the common case, compared at C speed: one side extends the other
        return n_max
    n = 0
    while n < n_max and a[n] == b[n]:
        n += 1
    return n
