"""Token ids -> the text a reader sees, one piece per token, safe to put in HTML.

A token decoded alone can lose its leading space (SentencePiece) or be half of a UTF-8 character, so each token
is decoded after a few tokens of context and only the new, complete text is kept: a token that completes a
character carries the whole character, the tokens before it carry nothing.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

CONTEXT = 4  # tokens of left context: enough for any multi-byte character or leading-space rule
PARTIAL = "\ufffd"  # what a tokenizer returns for half a character


def token_pieces(tokenizer, context: list[int], ids: list[int]) -> list[str]:
    """Text added by each of `ids` when it follows `context` (and the ids before it)."""
    seq = [int(t) for t in context[-CONTEXT:]]
    out = []
    for tok in ids:
        before = tokenizer.decode(seq).rstrip(PARTIAL)
        seq.append(int(tok))
        after = tokenizer.decode(seq).rstrip(PARTIAL)
        if after.startswith(before):
            out.append(after[len(before):])
        else:  # a tokenizer that rewrites earlier text (cleanup rules): the token alone is the best guess
            out.append(tokenizer.decode([int(tok)]).rstrip(PARTIAL))
        del seq[:-CONTEXT]
    return out


def special_ids(tokenizer) -> set[int]:
    return {int(i) for i in getattr(tokenizer, "all_special_ids", None) or []}


def raw_token(tokenizer, tok: int) -> str:
    """The vocabulary entry (e.g. '<|im_end|>', 'Ġthe'), for tooltips and special tokens."""
    try:
        return str(tokenizer.convert_ids_to_tokens([int(tok)])[0])
    except (IndexError, KeyError, TypeError, ValueError):
        return f"<{tok}>"


@dataclass
class Vocab:
    """The target tokenizer plus the set of its special ids, so renderers can mark them."""

    tokenizer: object
    specials: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, tokenizer) -> "Vocab":
        return cls(tokenizer=tokenizer, specials=special_ids(tokenizer))

    def pieces(self, context: list[int], ids: list[int]) -> list[str]:
        return token_pieces(self.tokenizer, context, ids)

    def raw(self, tok: int) -> str:
        return raw_token(self.tokenizer, tok)

    def is_special(self, tok: int) -> bool:
        return int(tok) in self.specials


def visible(piece: str, inline: bool = False) -> str:
    """Escape a piece for HTML and make whitespace readable.

    A newline shows as a small return mark; in the answer it also breaks the line, `inline` pieces (timeline
    chips, struck-through rejected drafts, cache cells) stay on one line.
    """
    if piece == "":
        return '<span class="ws">&#8203;</span>'  # half a character: an empty but hoverable token
    text = html.escape(piece, quote=False)
    if inline and piece.strip() == "":  # a bare space would be invisible in a chip or a struck-through draft
        text = text.replace(" ", '<span class="ws">&middot;</span>')
    text = text.replace("\t", '<span class="ws">&rarr;</span>\t')
    if inline:
        text = text.replace("\n", '<span class="ws">&crarr;</span>')
    else:
        text = text.replace("\n", '<span class="ws">&crarr;</span>\n')
    return text


def short(piece: str, limit: int = 6) -> str:
    """A piece cut to fit a small box (cache cells), whitespace made visible, escaped."""
    shown = piece.replace("\n", "\u21b5").replace("\t", "\u2192")
    if shown.strip() == "":
        shown = shown.replace(" ", "\u00b7") or "\u2205"
    if len(shown) > limit:
        shown = shown[: limit - 1] + "\u2026"
    return html.escape(shown)


def tip(lines: list[str]) -> str:
    """A tooltip as an escaped attribute value (CSS shows data-tip on hover, one line per entry)."""
    return html.escape("\n".join(line for line in lines if line), quote=True)
