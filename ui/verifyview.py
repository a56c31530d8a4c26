"""Verification by rejection sampling, row by row, for step mode: what each judged draft token's fate came from.

At temperature > 0 with a drafter that gives its distribution q, the target keeps draft token d when a uniform
u <= min(1, p(d)/q(d)) (engine/round/verify.py `rejection`); at the first refusal it draws its own token from
the residual norm(max(0, p - q)), the part of p the draft under-proposed. The numbers are the round's event's
(RoundEvent.p_draft_rows, q_draft, uniforms, residual_top), never recomputed by the page.
"""

from __future__ import annotations

from ui.tokens import Vocab, tip, visible

HEAD = ("<tr><th>pos</th><th>draft token judged</th><th>p(d) target</th><th>q(d) draft</th><th>min(1, p/q)</th>"
        "<th>uniform u</th><th>verdict</th></tr>")


def _num(values, i: int) -> float | None:
    return float(values[i]) if values is not None and i < len(values) and values[i] is not None else None


def rejection_rows(ev, vocab: Vocab, context: list[int]) -> list[tuple[str, ...]]:
    """One row per draft token: its position, text, p, q, min(1, p/q), the uniform drawn and the verdict; then the
    bonus row where every draft token was kept."""
    k, m = len(ev.drafted), ev.n_accepted
    pieces = vocab.pieces(context, ev.drafted)
    rows = []
    for i in range(k):
        p, q, u = _num(ev.p_draft_rows, i), _num(ev.q_draft, i), _num(ev.uniforms, i)
        ratio = min(1.0, p / q) if p is not None and q else None
        if i < m:
            verdict = f'<span class="v-acc">u &le; min(1, p/q): d{i + 1} accepted</span>'
        elif i == m and u is not None:
            verdict = (f'<span class="v-bonus">u &gt; min(1, p/q): d{i + 1} rejected; the target draws its '
                       f'correction from the residual below</span>')
        else:
            verdict = '<span class="v-rej">not judged (after the first rejection)</span>'
        cells = [f"{x:.3f}" if x is not None else "–" for x in (p, q, ratio, u)]
        rows.append((str(ev.p0 + i), visible(pieces[i], inline=True), *cells, verdict))
    if m == k and len(ev.emitted) > k:
        bonus = vocab.pieces(context + list(ev.drafted), [ev.emitted[-1]])[0]
        rows.append((str(ev.p0 + k), '<span class="muted">(none: bonus row)</span>', "–", "–", "–", "–",
                     f'<span class="v-bonus">every draft kept: the bonus {visible(bonus, inline=True)} is drawn '
                     f'from p</span>'))
    return rows


def residual_html(ev, vocab: Vocab, context: list[int]) -> str:
    """The residual's most likely tokens as bars, the token drawn marked; empty where nothing was rejected."""
    if not ev.residual_top:
        return ""
    m = ev.n_accepted
    before = context + list(ev.drafted[:m])
    drawn = ev.emitted[-1] if len(ev.emitted) > m else None
    bars = []
    for tok, prob in ev.residual_top:
        piece = vocab.pieces(before, [int(tok)])[0]
        cls = "res-bar res-drawn" if tok == drawn else "res-bar"
        bars.append(f'<div class="{cls}" data-tip="{tip([f"#{tok} {vocab.raw(int(tok))!r}"])}">'
                    f'<span class="res-tok">{visible(piece, inline=True)}</span>'
                    f'<span class="res-fill" style="width:{max(1.0, 100 * float(prob)):.1f}%"></span>'
                    f'<span class="res-p">{float(prob):.3f}</span></div>')
    if drawn is None:
        said = "a stop cut the answer before the drawn token was shown"
    else:
        piece = visible(vocab.pieces(before, [drawn])[0], inline=True)
        outside = "" if any(tok == drawn for tok, _ in ev.residual_top) else \
            f", outside the {len(ev.residual_top)} most likely"
        said = f"drawn: <b>{piece}</b>{outside}"
    return (f'<div class="residual"><p>After the rejection at position {ev.p0 + m} the target draws from the '
            f'residual norm(max(0, p &minus; q)): the mass p puts where the draft put less. Its most likely tokens; '
            f'{said}.</p>{"".join(bars)}</div>')


def rejection_html(ev, vocab: Vocab, context: list[int]) -> str:
    """The rejection-sampling table and the residual, for step mode (ui/timeline.py step_html)."""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
                   for row in rejection_rows(ev, vocab, context))
    return f'<table class="verify-rows">{HEAD}{body}</table>{residual_html(ev, vocab, context)}'
