"""The answer as the reader sees it: every token marked by what happened to it, plus the chat around it.

Pure functions of RoundEvents (and the target vocabulary) to HTML strings. CSS classes are a contract with
assets/style.css and the browser test: .tok-acc accepted draft, .tok-bonus the target's own token after a
verified draft (bonus or correction), .tok-forced a token the grammar forced (accepted from the `grammar` drafter:
constrained output, not a guess), .tok-rej rejected draft (struck through, where it was proposed, in an
s.rej-group with its drafter's tag), .tok-tgt the target's token in a round without a draft, .tok-special a
special token such as end-of-turn.
"""

from __future__ import annotations

import html
import re

from ui.tokens import Vocab, tip, visible

# kind -> CSS classes. The tooltip's first line (what happened) comes from the class in assets/style.css, so
# each of the thousands of token spans carries only its own numbers: the answer's HTML stays small.
CLASSES = {"acc": "tok tok-acc", "bonus": "tok tok-bonus", "fix": "tok tok-bonus tok-fix", "rej": "tok tok-rej",
           "forced": "tok tok-forced", "tgt": "tok tok-tgt", "first": "tok tok-tgt tok-first"}

# A rejected run is an <s> element (text no longer relevant) and nothing inside it is an <s> (token text is
# escaped), so finished turns, cached as HTML, can drop their rejected drafts without being rendered again.
REJECTED_RUN = re.compile(r'<s class="rej-group">.*?</s>', re.DOTALL)


def drafter_tag(name: str | None) -> str:
    """A short drafter name for inline tags: 'ngram-map-k' -> 'map-k', 'draft-simple' -> 'draft', 'draft-head' -> 'head',
    'draft-uni' -> 'uni', 'draft-mtp' -> 'mtp', 'draft-dflash' -> 'dflash', 'draft-dspark' -> 'dspark'."""
    if not name:
        return ""
    if name == "draft-simple":
        return "draft"
    if name == "draft-head":
        return "head"
    if name == "draft-eagle3":
        return "eagle3"
    if name == "draft-mtp":
        return "mtp"
    if name in ("draft-uni", "draft-dflash", "draft-dspark"):
        return name.removeprefix("draft-")
    return name.removeprefix("ngram-")


def fmt_prob(label: str, values: list[float] | None, i: int) -> str:
    if values is None or i >= len(values) or values[i] is None:
        return ""
    return f"{label} {float(values[i]):.3f}"


def judged_line(ev, p_rows: list[float] | None, i: int, emitted: bool) -> str:
    """The hover's verification line for the token at index i of the round: min(1, p/q) where a drafter gave q,
    and the target's entropy at the token's row (GenParams.explain) for an emitted token."""
    parts = []
    q = ev.q_draft[i] if ev.q_draft is not None and i < len(ev.q_draft) else None
    p = p_rows[i] if p_rows is not None and i < len(p_rows) else None
    if q is not None and p is not None and q > 0:
        parts.append(f"min(1, p/q) {min(1.0, float(p) / float(q)):.3f}")
    entropy = getattr(ev, "entropy", None) or []
    if emitted and i < len(entropy):
        parts.append(f"target entropy {float(entropy[i]):.2f} bits")
    return "  ".join(parts)


def token_span(kind: str, piece: str, tok: int, pos: int, vocab: Vocab, ev, p: str, q: str, judged: str = "") -> str:
    """One token as a span; hovering shows what happened (from its class), position, drafter, p, q, the
    acceptance probability min(1, p/q) and the target's entropy there."""
    classes = CLASSES[kind]
    shown = visible(piece, inline=kind == "rej")
    if vocab.is_special(tok):
        classes += " tok-special"
        shown = html.escape(vocab.raw(tok))
    drafter = f"drafter {ev.drafter}" if kind in ("acc", "forced", "rej") and ev.drafter else ""
    probs = "  ".join(x for x in (p, q) if x)
    data = tip([f"pos {pos} · round {ev.round}", drafter, probs, judged, f"#{tok} {vocab.raw(tok)!r}"])
    return f'<span class="{classes}" data-tip="{data}">{shown}</span>'


def emitted_kind(ev, i: int) -> str:
    if i < ev.n_accepted:
        # the grammar's tokens are kept because the output format leaves no other way on, not because a drafter
        # guessed well: a mark of their own, so structured output does not pass for high acceptance
        return "forced" if ev.drafter == "grammar" else "acc"
    if ev.kind == "prefill":
        return "first"
    if not ev.drafted:
        return "tgt"
    return "fix" if ev.n_accepted < len(ev.drafted) else "bonus"


def round_html(ev, vocab: Vocab, context: list[int]) -> str:
    """One round of the answer: accepted drafts, rejected drafts struck through, then the target's token.

    `context` is the answer so far (ids before this round), for decoding pieces. The rejected tokens sit
    between the accepted ones and the target's correction because that is where they were proposed.
    """
    m = ev.n_accepted
    emitted = list(ev.emitted)
    pieces = vocab.pieces(context, emitted)
    parts = []
    for i, tok in enumerate(emitted[:m]):
        parts.append(token_span(emitted_kind(ev, i), pieces[i], tok, ev.p0 + i, vocab, ev, fmt_prob("p", ev.p_target, i),
                                fmt_prob("q", ev.q_draft, i), judged_line(ev, ev.p_target, i, True)))
    if len(emitted) > m and ev.rejected:  # cut at a stop inside the accepted run: the rest was never shown
        rej_pieces = vocab.pieces(context + emitted[:m], ev.rejected)
        spans = []
        for j, tok in enumerate(ev.rejected, start=m):
            # after the first rejected token the target's p is conditioned on a prefix it refused: say so
            p = fmt_prob("p", ev.p_draft_rows, j)
            if p and j > m:
                p += " (after a rejected token)"
            spans.append(token_span("rej", rej_pieces[j - m], tok, ev.p0 + j, vocab, ev, p,
                                    fmt_prob("q", ev.q_draft, j), judged_line(ev, ev.p_draft_rows, j, False)))
        tag = html.escape(drafter_tag(ev.drafter))
        parts.append(f'<s class="rej-group"><span class="rej-tag">{tag}</span>{"".join(spans)}</s>')
    for i in range(m, len(emitted)):
        parts.append(token_span(emitted_kind(ev, i), pieces[i], emitted[i], ev.p0 + i, vocab, ev,
                                fmt_prob("p", ev.p_target, i), "", judged_line(ev, None, i, True)))
    return f'<span class="rnd" data-round="{ev.round}" data-kind="{html.escape(ev.kind)}">{"".join(parts)}</span>'


def legend_html() -> str:
    items = [
        ("tok-acc", "accepted", "a drafted token the target agreed with"),
        ("tok-forced", "forced", "fixed by the output format (grammar drafter), checked by the target"),
        ("tok-bonus", "target's token", "the bonus (all accepted) or the correction (after a rejection)"),
        ("tok-rej", "rejected", "drafted, refused by the target, removed from the cache (tag: drafter)"),
        ("tok-tgt", "plain", "the target's token in a round without a draft"),
    ]
    spans = "".join(f'<span class="legend-item"><span class="tok {cls}">{html.escape(name)}</span>'
                    f'<span class="legend-text">{html.escape(text)}</span></span>' for cls, name, text in items)
    hint = "hover a token for p, q, min(1, p/q), the target&#39;s entropy and its position"
    return f'<div class="legend">{spans}<span class="legend-hint">{hint}</span></div>'


def user_bubble(text: str) -> str:
    return f'<div class="msg msg-user"><div class="who">you</div><div class="bubble">{html.escape(text)}</div></div>'


def answer_bubble(body: str, meta: str = "", live: bool = False) -> str:
    """The assistant's turn: the marked tokens and a one-line footer (speed, stop reason)."""
    cursor = '<span class="cursor"></span>' if live else ""
    foot = f'<div class="meta">{meta}</div>' if meta else ""
    return (f'<div class="msg msg-bot"><div class="who">assistant</div>'
            f'<div class="bubble answer">{body}{cursor}</div>{foot}</div>')


def without_rejected(turn: str) -> str:
    """A turn's HTML without its rejected drafts: the answer as the target wrote it, still coloured."""
    return REJECTED_RUN.sub("", turn)


def transcript_html(turns: list[str], empty_hint: str = "", show_rejected: bool = True) -> str:
    """The whole chat: cached HTML of finished turns plus the live one, newest at the bottom."""
    if not turns:
        return f'<div class="chat chat-empty">{html.escape(empty_hint)}</div>'
    if not show_rejected:
        turns = [without_rejected(t) for t in turns]
    return f'<div class="chat">{"".join(turns)}</div>'


def tps(n_tokens: int, seconds: float) -> float | None:
    return n_tokens / seconds if seconds > 0 and n_tokens > 0 else None


def speed_line(n_tokens: int, n_decode: int, seconds: float, n_rounds: int, stop_reason: str | None = None) -> str:
    """'31 tokens · 20.3 tok/s · 7 rounds · 4.29 tokens/round': speed measured from the events.

    tokens/s counts the tokens after the first over the time from the first token to the last: the first
    token's cost is the prompt's (prefill), which the plain baseline may skip through prefix reuse."""
    rate = tps(n_decode, seconds)
    parts = [f"{n_tokens} tokens"]
    parts.append(f"<b>{rate:.1f} tok/s</b>" if rate else "– tok/s")
    if n_rounds:
        parts.append(f"{n_rounds} rounds")
        parts.append(f"{n_decode / n_rounds:.2f} tokens/round")
    if stop_reason:
        parts.append(f"stop: {html.escape(stop_reason)}")
    return " · ".join(parts)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two outputs differ (a length difference counts), None if identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_html(spec_ids: list[int], plain_ids: list[int], tps_spec: float | None, tps_plain: float | None,
                 vocab: Vocab, sampled: bool = False, load: str = "", cut: str = "", note: str = "",
                 checked: bool = True) -> str:
    """Speedup of speculative over plain decoding and the lossless badge (same seed, same prompt). `load` says
    why the ratio was taken under load; the figure is then shown greyed, with that reason beside it. `cut`
    names the run that the full shared cache ended early: the badge then judges the tokens both runs have.
    `note` says how the two speeds were taken. `checked`: the model passed its load check (engine/memory/
    self_check.py); otherwise identical runs are only called identical, since plain decoding itself is unproven."""
    if tps_spec and tps_plain:
        ratio = tps_spec / tps_plain
        cls = "speedup-load" if load else "speedup-up" if ratio >= 1.0 else "speedup-down"
        speed = (f'<span class="speedup {cls}">{ratio:.2f}&times;</span> '
                 f'<span class="cmp-detail">{tps_spec:.1f} tok/s speculative vs {tps_plain:.1f} tok/s plain</span>')
    else:
        speed = '<span class="cmp-detail">speedup: too few tokens to measure</span>'
    if cut:
        n = min(len(spec_ids), len(plain_ids))
        spec_ids, plain_ids = spec_ids[:n], plain_ids[:n]
    diff = first_difference(spec_ids, plain_ids)
    if diff is None and cut:
        badge = (f'<span class="badge lossless-ok">lossless &#10003; identical first {len(spec_ids)} tokens</span>'
                 f'<span class="cmp-detail"> (the {html.escape(cut)} run stopped early: the cache other chats '
                 f'share was full)</span>')
    elif diff is None:
        badge = f'<span class="badge lossless-ok">lossless &#10003; identical {len(spec_ids)} tokens</span>'
    else:
        a = html.escape(repr(vocab.raw(spec_ids[diff]))) if diff < len(spec_ids) else "end"
        b = html.escape(repr(vocab.raw(plain_ids[diff]))) if diff < len(plain_ids) else "end"
        why = " (expected with rejection sampling at temperature &gt; 0: same distribution, other draws)" \
            if sampled else ""
        badge = (f'<span class="badge lossless-diff">differs at token {diff}: speculative {a}, plain {b}</span>'
                 f'<span class="cmp-detail">{why}</span>')
    if diff is None and not checked:
        badge = (f'<span class="badge unchecked">identical {len(spec_ids)} tokens, not called lossless'
                 f'</span><span class="cmp-detail"> (the model did not pass the load check against transformers\' '
                 f'forward: see the status line)</span>')
    under_load = f'<div class="cmp-load">{html.escape(load)}</div>' if load else ""
    how = f'<div class="cmp-how">{html.escape(note)}</div>' if note else ""
    return f'<div class="compare">{speed} {badge}{under_load}{how}</div>'


def notice_html(text: str, level: str = "info") -> str:
    """A visible message box (level: info | warn | error) for bad input, busy slots, load results."""
    if not text:
        return ""
    return f'<div class="notice notice-{html.escape(level)}">{html.escape(text)}</div>'
