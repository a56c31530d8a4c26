"""The confirmed text in two vocabularies, kept in step a tail at a time: the text side of draft-uni.

llama.cpp's common_speculative_gen_draft (common/speculative.cpp, its path for a draft context whose vocabulary
is not the target's) detokenises the target's tokens, tokenises that text with the draft's vocabulary, drafts,
detokenises the draft and tokenises it with the target's vocabulary again, over the whole prompt every round.
transformers' AssistedCandidateGeneratorDifferentTokenizers converts only a lookbehind window of recent tokens
and aligns the result with what it had. Here each sequence keeps the target tokens already converted, the text
they decode to and the draft tokens of that text, each token with the character where it ends. A round decodes
and encodes only the text after a seam a few tokens before the first new target token, where both token lists
end a token on a whole character: a merge that reaches across the seam is redone, and the draft tokens come out
as an encoding of the whole text would give them, while the cost stays that of the tail.

Specials are kept as text on both sides, as llama.cpp does (common_detokenize with special=true, tokenised with
parse_special), so a chat's structure and the draft's own BOS come through when both vocabularies spell them
alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.prefix import common_prefix

UNKNOWN = -1  # a token whose end is not known: inside a long segment, or in the middle of a character


@dataclass
class BridgeParams:
    back_off: int = 4  # tokens re-read before the first changed one, on each side: merges at the seam come out right
    context: int = 4  # target tokens decoded before the seam and subtracted: a decoder may render a text's first
    #                   token differently (a SentencePiece leading space), so a tail is never decoded alone
    ends_kept: int = 32  # ends worked out for the last tokens of a long new segment (a prompt): seams fall there


@dataclass
class Side:
    """One vocabulary's tokens of the shared text."""
    tokens: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # character where each token's text ends; UNKNOWN where not known

    def seam(self, limit: int) -> int:
        """The most tokens, at most `limit`, that end on a known character (0: the start of the text)."""
        k = max(0, min(limit, len(self.tokens)))
        while k > 0 and self.ends[k - 1] == UNKNOWN:
            k -= 1
        return k

    def char(self, k: int) -> int:
        return self.ends[k - 1] if k > 0 else 0


@dataclass
class BridgeState:
    """One sequence's confirmed text and its tokens in both vocabularies."""
    text: str = ""
    target: Side = field(default_factory=Side)
    draft: Side = field(default_factory=Side)
    chars_encoded: int = 0  # characters the draft's tokenizer encoded at the last sync: the tail, not the text


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def encode(tokenizer, text: str) -> list[int]:
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


ANCHOR = "\n"  # a text encoded before a tail where the tokenizer opens every text with a space (below)


class TailEncoder:
    """Encodes a tail of a text as the tokenizer encodes it inside the whole text.

    A SentencePiece tokenizer with a dummy prefix (Llama 2's, `▁` put before every text) encodes "ller" alone as
    "▁ller", not as the "ller" of "▁miller": for such a tokenizer a tail is encoded after ANCHOR and the anchor's
    tokens taken off. Gemma 3's tokenizer and byte-level BPE encode a tail alone as inside the text: no anchor."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.anchor = encode(tokenizer, ANCHOR)
        self.anchored = encode(tokenizer, ANCHOR + "a")[len(self.anchor):] != encode(tokenizer, "a")

    def __call__(self, text: str, at_start: bool) -> list[int]:
        if at_start or not self.anchored:
            return encode(self.tok, text)
        ids = encode(self.tok, ANCHOR + text)
        n = len(self.anchor)
        return ids[n:] if ids[:n] == self.anchor else encode(self.tok, text)


def tail_text(tokenizer, ids: list[int], j: int, k: int) -> tuple[str, str] | None:
    """(text of ids[j:k], text of ids[j:]) decoded together, so ids[k:]'s text is the second minus the first;
    None where decoding more tokens changed the text of the first ones."""
    base, full = decode(tokenizer, ids[j:k]), decode(tokenizer, ids[j:])
    return (base, full) if full.startswith(base) else None


def token_ends(tokenizer, ids: list[int], j: int, k: int, base: str, start: int, keep: int) -> list[int]:
    """Where each of ids[k:] ends in the shared text, ids[k:] starting at character `start`; worked out for the
    last `keep` only (each costs a decoding), UNKNOWN for the rest and where a token ends inside a character."""
    out = []
    for i in range(k, len(ids)):
        if i < len(ids) - keep:
            out.append(UNKNOWN)
            continue
        text = decode(tokenizer, ids[j:i + 1])
        whole = text.startswith(base) and not text.endswith("\ufffd")
        out.append(start + len(text) - len(base) if whole else UNKNOWN)
    return out


class TextBridge:
    """Converts confirmed target tokens to draft tokens through their text, and a draft's text back."""

    def __init__(self, target_tokenizer, draft_tokenizer, params: BridgeParams | None = None):
        self.tt = target_tokenizer
        self.td = draft_tokenizer
        self.params = params or BridgeParams()
        self.encode_t, self.encode_d = TailEncoder(target_tokenizer), TailEncoder(draft_tokenizer)

    def sync(self, st: BridgeState, confirmed: list[int]) -> None:
        """Bring `st` to the confirmed target tokens: decode the tail after the target seam, cut the draft tokens
        a few before that character, encode the text from there."""
        p = self.params
        tgt = st.target
        k = tgt.seam(common_prefix(confirmed, tgt.tokens) - p.back_off)
        j = max(0, k - p.context)
        texts = tail_text(self.tt, confirmed, j, k)
        if texts is None:  # the decoder renders the seam differently with the new tokens: start over
            k = j = 0
            texts = tail_text(self.tt, confirmed, 0, 0)
        base, full = texts
        c = tgt.char(k)
        st.text = st.text[:c] + full[len(base):]
        tgt.ends[k:] = token_ends(self.tt, confirmed, j, k, base, c, p.ends_kept)
        tgt.tokens[k:] = confirmed[k:]
        self._sync_draft(st, c)

    def _sync_draft(self, st: BridgeState, c: int) -> None:
        """The draft tokens after the text changed from character `c` on."""
        p, dft = self.params, st.draft
        kd = len(dft.tokens)
        while kd > 0 and not UNKNOWN < dft.ends[kd - 1] <= c:
            kd -= 1
        kd = dft.seam(kd - p.back_off)
        cd = dft.char(kd)
        new = self.encode_d(st.text[cd:], at_start=cd == 0)
        st.chars_encoded = len(st.text) - cd
        jd = max(0, kd - p.context)
        ids = dft.tokens[:kd] + new
        base = decode(self.td, ids[jd:kd])
        if decode(self.td, ids[jd:]) == base + st.text[cd:]:
            ends = token_ends(self.td, ids, jd, kd, base, cd, p.ends_kept)
        else:  # the draft's tokens do not decode back to this text: no seam inside it can be trusted
            ends = [UNKNOWN] * len(new)
        dft.tokens[kd:] = new
        dft.ends[kd:] = ends

    def draft_text(self, st: BridgeState, drafted: list[int]) -> str:
        """The text the draft's tokens add after the confirmed text ('' where they change the text before them);
        a character cut in half at the end is left out."""
        ctx = st.draft.tokens[-self.params.context:]
        texts = tail_text(self.td, ctx + drafted, 0, len(ctx))
        if texts is None:
            return ""
        base, full = texts
        return full[len(base):].rstrip("\ufffd")

    def to_target(self, st: BridgeState, added: str) -> list[int]:
        """The whole target tokens that the confirmed text followed by `added` supports after the confirmed ones.

        The text from a target seam on is encoded with the target's vocabulary; the tokens must begin with the
        confirmed tokens after the seam, else the drafted text does not extend the confirmed tokens as the target
        wrote them (a merge across the confirmed end) and nothing is drafted. The last token is left out: the text
        ends where the draft stopped, which may be inside a longer target token."""
        if not added:
            return []
        tgt = st.target
        k = tgt.seam(len(tgt.tokens) - self.params.back_off)
        ids = self.encode_t(st.text[tgt.char(k):] + added, at_start=tgt.char(k) == 0)
        own = tgt.tokens[k:]
        if ids[:len(own)] != own:
            return []
        return ids[len(own):-1]
