"""How many characters a text may hold before the page or the API tokenizes it.

A tokenizer's time grows with its input, and a chat template renders the whole text first, so a text is refused
by its length before either runs: no token decodes to more characters than the vocabulary's longest, so a text
longer than the context's tokens times that cannot fit and is refused unread (a message, an arena or bench
prompt, an API request's messages).
"""

from __future__ import annotations

UNBOUNDED_CHARS = 1 << 20  # a runtime that states no context limit: the request body's own bound


def longest_token(tokenizer) -> int:
    """Characters of the vocabulary's longest token as stored: no token decodes to more text than that."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max((len(p) for p in pieces if isinstance(p, str)), default=1)


def text_bound(runtime) -> int | None:
    """The most characters a text for this runtime may hold (None: no model loaded); worked out once per
    runtime, the vocabulary scan takes a few milliseconds."""
    if runtime is None:
        return None
    known = getattr(runtime, "text_chars", None)
    if known:
        return known
    limit = getattr(runtime.engine, "prompt_limit", None)
    tokenizer = getattr(runtime.target, "tokenizer", None)  # a stand-in target of a test may have none
    bound = UNBOUNDED_CHARS if limit is None or tokenizer is None else limit * longest_token(tokenizer)
    runtime.text_chars = bound
    return bound
