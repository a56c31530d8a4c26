"""Round timeline (one row per round) and the step-mode view of one verification batch.

Pure functions of RoundEvents to HTML. A row is rendered once, when its round arrives, and cached by the
caller; the table is then a join of cached rows, so 300 rounds cost a join, not 300 renders.
"""

from __future__ import annotations

import html

from ui.narration import narration_html, relay_line
from ui.tokens import Vocab, tip, visible
from ui.treeview import tree_html, tree_summary
from ui.verifyview import rejection_html

MAX_ROWS = 120  # rows shown live; older ones are summarised in one line (the answer keeps every token)

HEADER = ("<tr><th>#</th><th>drafter</th><th>p0</th><th>drafted (green kept, red rejected)</th>"
          "<th>m/k</th><th>target token</th><th>rollback</th><th>draft ms</th><th>verify ms</th><th>rollback ms</th></tr>")


def chips(ids: list[int], pieces: list[str], n_kept: int, p0: int) -> str:
    out = []
    for i, (tok, piece) in enumerate(zip(ids, pieces)):
        cls = "chip-acc" if i < n_kept else "chip-rej"
        out.append(f'<span class="chip {cls}" data-tip="{tip([f"d{i + 1} at position {p0 + i}", f"token {tok}"])}">'
                   f'{visible(piece, inline=True)}</span>')
    return "".join(out)


def rollback_text(ev) -> str:
    """What the cache lost this round, in llama.cpp terms, by the engine's own word for it (RoundEvent.rollback)."""
    if ev.rollback == "tree":
        kept = f"path kept [{ev.p0}, {ev.p0 + ev.n_accepted})" if ev.n_accepted else "no node kept"
        return f"branches freed by cell; {kept} ({ev.rm_cells} cell(s) freed one by one)"
    if ev.rollback == "checkpoint" and ev.kind == "replay":
        return f"replay from {ev.pos_sampled}"
    if ev.rollback == "checkpoint":
        return f"restore + replay: {ev.rm_cells} cell(s) [{ev.rm_range[0]}, {ev.rm_range[1]})"
    if ev.rollback == "seq_rm" and ev.rm_range is not None:
        rs = f" + {ev.rs_undone} recurrent step(s) undone" if ev.rs_undone else ""
        return f"seq_rm [{ev.rm_range[0]}, {ev.rm_range[1]}){rs}"
    return "–"


def retokenized(ev) -> str:
    """A draft model of another vocabulary drafted in its own tokens: those, and the target tokens they became."""
    if not getattr(ev, "draft_pieces", None):
        return ""
    own = ", ".join(html.escape(repr(p)) for p in ev.draft_pieces)  # quoted: a piece's leading space shows
    target = ", ".join(html.escape(repr(p)) for p in ev.target_pieces)
    return f'<div class="muted retok">draft tokens: [{own}] → target tokens: [{target}]</div>'


def timeline_row(ev, vocab: Vocab, context: list[int]) -> str:
    """One round as a table row; `context` is the answer before this round (to decode the pieces)."""
    k, m = len(ev.drafted), ev.n_accepted
    if ev.kind == "prefill":
        drafter = '<span class="muted">prefill</span>'
        drafted = f'<span class="muted">{ev.batch_rows} prompt tokens in the batch</span>'
        ratio = ""
    elif k == 0:
        drafter = '<span class="muted">–</span>'
        relay = relay_line(ev)
        drafted = f'<span class="muted">no draft{": " + html.escape(relay) if relay else ""}</span>'
        ratio = ""
    else:
        drafter = html.escape(ev.drafter or "?")
        drafted = chips(ev.drafted, vocab.pieces(context, ev.drafted), m, ev.p0) + tree_summary(ev) + retokenized(ev)
        ratio = f"{m}/{len(ev.tree_tokens) or k}"
    target = ""
    if len(ev.emitted) > m:  # the target's own token; missing when a stop cut the accepted run
        tok = ev.emitted[-1]
        piece = vocab.pieces(context + ev.emitted[:-1], [tok])[0]
        target = f'<span class="chip chip-bonus">{visible(piece, inline=True)}</span>'
    stop = f' <span class="muted">({html.escape(ev.stop_reason)})</span>' if ev.done and ev.stop_reason else ""
    cls = "row-rej" if ev.rm_range is not None else "row-acc" if k and m == k else ""
    return (f'<tr class="{cls}"><td>{ev.round}</td><td>{drafter}</td><td>{ev.p0}</td><td class="drafted">'
            f'{drafted}</td><td>{ratio}</td><td>{target}{stop}</td><td>{rollback_text(ev)}</td>'
            f'<td>{ev.t_draft_ms:.1f}</td><td>{ev.t_verify_ms:.1f}</td><td>{ev.t_rollback_ms:.2f}</td></tr>')


def timeline_html(rows: list[str], max_rows: int = MAX_ROWS) -> str:
    """Cached rows, newest first so the live round is always in view."""
    if not rows:
        return '<div class="timeline muted">Rounds appear here while the answer streams.</div>'
    shown = rows[-max_rows:][::-1]
    more = len(rows) - len(shown)
    tail = f'<tr><td colspan="10" class="muted">… {more} earlier rounds</td></tr>' if more else ""
    return f'<div class="timeline"><table>{HEADER}{"".join(shown)}{tail}</table></div>'


def step_rows(ev, vocab: Vocab, context: list[int], sampled: int | None) -> list[tuple[str, ...]]:
    """The batch [sampled, d1..dk] row by row: position, input, the target's top choice, the draft it judges, verdict.

    Row i holds the input at position pos_sampled + i; its logits predict position p0 + i, where d(i+1) was
    drafted. `sampled` is last round's token (the first row's input), known to the caller.
    """
    k, m = len(ev.drafted), ev.n_accepted
    inputs = ([sampled] if sampled is not None else [None]) + list(ev.drafted)
    in_pieces = vocab.pieces(context[:-1] if context else [], [t for t in inputs if t is not None])
    if sampled is None:
        in_pieces = ["?"] + in_pieces
    top_pieces = [vocab.pieces(context + ev.drafted[:i], [int(t)])[0] for i, t in enumerate(ev.target_top)]
    draft_pieces = vocab.pieces(context, ev.drafted)
    rows = []
    for i in range(k + 1):
        top = visible(top_pieces[i], inline=True) if i < len(top_pieces) else "?"
        judged = visible(draft_pieces[i], inline=True) if i < k else '<span class="muted">(none: bonus row)</span>'
        if i < m:
            verdict = f'<span class="v-acc">d{i + 1} accepted</span>'
        elif i == m:
            bonus = "correction" if m < k else "bonus"
            what = f"d{i + 1} rejected; " if m < k else ""
            verdict = f'<span class="v-bonus">{what}target token = {bonus}</span>'
        else:
            verdict = '<span class="v-rej">discarded (after the first rejection)</span>'
        rows.append((str(ev.pos_sampled + i), visible(in_pieces[i], inline=True), top, judged, verdict))
    return rows


def step_html(ev, vocab: Vocab, context: list[int], sampled: int | None, roof=None) -> str:
    """Step mode: the whole verification batch of the latest round, and what the rollback removes, told in the
    lesson's order (ui/narration.py; `roof`: this machine's forward by rows)."""
    if ev is None:
        return ('<div class="step muted">Tick <b>Step mode</b>, send a message, then press <b>Step</b>: '
                'each press runs one round and shows its batch here.</div>')
    if ev.tree_tokens:
        return tree_step_html(ev, vocab, context, roof)
    if ev.kind == "prefill":
        return (f'<div class="step"><p><b>Round 0: prefill.</b> {ev.batch_rows} prompt tokens went through the '
                f'target in one batch; it sampled the first token at position {ev.p0}. Press Step for the first '
                f'draft round.</p>{narration_html(ev, roof)}</div>')
    head = ("<tr><th>pos</th><th>batch input</th><th>target's top choice next</th><th>draft token judged</th>"
            "<th>verdict</th></tr>")
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
                   for row in step_rows(ev, vocab, context, sampled))
    table = (rejection_html(ev, vocab, context) if ev.verify_mode == "rejection" and ev.drafted
             else f"<table>{head}{body}</table>")
    k, m = len(ev.drafted), ev.n_accepted
    removed = f'<p class="{"v-rej" if ev.rollback != "none" else "v-acc" if k else "muted"}">{removed_text(ev)}</p>'
    mode = ("rejection sampling min(1, p/q)" if ev.verify_mode == "rejection"
            else "sample-and-match (argmax at temperature 0)")
    if k:
        intro = (f'<p><b>Round {ev.round}</b>: {k} token(s) drafted by {html.escape(ev.drafter or "?")}, batch of '
                 f'{k + 1} rows at positions {ev.pos_sampled}..{ev.pos_sampled + k}, verified by {mode}: {m} '
                 f'accepted.</p>')
    else:
        what = "a replay of the decided tokens" if ev.kind == "replay" else "no draft, one row"
        intro = f'<p><b>Round {ev.round}</b>: {what}.</p>'
    done = f'<p class="muted">Finished: {html.escape(ev.stop_reason or "")}.</p>' if ev.done else ""
    return f'<div class="step">{intro}{table}{removed}{done}{narration_html(ev, roof)}</div>'


def removed_text(ev) -> str:
    """Step mode's line on what left the cache, by the engine's word for how (RoundEvent.rollback)."""
    if ev.rollback == "seq_rm" and ev.rm_range is not None:
        a, b = ev.rm_range
        rs = f"; the recurrent layers undo {ev.rs_undone} step(s) of state with it" if ev.rs_undone else ""
        return (f"Rollback: <code>seq_rm(seq {ev.seq}, {a}, -1)</code> frees cells [{a}, {b}): the {b - a} "
                f"rejected draft token(s){rs}.")
    if ev.rollback == "tree":
        return (f"Rollback: {ev.rm_cells} node cell(s) freed one by one (siblings share positions, so no position "
                f"range names them); the kept path moves to its sequence's run of cells.")
    if ev.rollback == "checkpoint" and ev.kind == "replay":
        return "Replay: the decided tokens are written back after last round's restore; nothing to remove."
    if ev.rollback == "checkpoint":
        return (f"Rollback: checkpoint restored, the batch's {ev.rm_cells} cell(s) gone with it; the sampled "
                f"token, the {ev.n_accepted} kept and the target's own token are replayed next round.")
    if ev.drafted:
        return "Nothing to remove: every drafted token was accepted."
    return "No draft this round: a plain decoding step."


def tree_step_html(ev, vocab: Vocab, context: list[int], roof=None) -> str:
    """Step mode for a tree round: the tree, the walk of the target, what left the cache, and the round told in
    the lesson's order (ui/narration.py)."""
    m = ev.n_accepted
    intro = (f'<p><b>Round {ev.round}</b>: {len(ev.tree_tokens)} draft nodes from '
             f'{", ".join(sorted(set(ev.tree_drafters)))} in one batch of {len(ev.tree_tokens) + 1} rows '
             f'(each node sees the committed text and its own ancestors only). The target walked from its sampled '
             f'token: {m} node(s) matched its own tokens, then it gave its own.</p>')
    removed = f'<p class="v-rej">{removed_text(ev)}</p>' if ev.rollback != "none" else ""
    done = f'<p class="muted">Finished: {html.escape(ev.stop_reason or "")}.</p>' if ev.done else ""
    return (f'<div class="step">{intro}{tree_html(ev, vocab, context)}{removed}{done}'
            f'{narration_html(ev, roof)}</div>')
