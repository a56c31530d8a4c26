"""The KV cache of one sequence after the latest round, as a strip of cells.

What a round does to the cache, left to right: confirmed cells (prompt, earlier answer), the batch appended
this round ([sampled, d1..dk] at pos_sampled..p0+k-1, or a tree's nodes), of which the accepted drafts stay and
the rest leaves as the engine says it did (RoundEvent.rollback): a chain's tail [p0+m, p0+k) by one seq_rm, a
tree's branches cell by cell, or the whole batch with a checkpoint restore; the target's own token is not in the
cache yet, the next round writes it.
"""

from __future__ import annotations

import html

from ui.tokens import Vocab, short, tip

WINDOW = 40  # cells drawn one by one; older cells fold into one block

LEGEND = (("kv-prompt", "prompt"), ("kv-gen", "answer so far"), ("kv-sampled", "last token, written this round"),
          ("kv-acc", "draft kept this round"), ("kv-freed", "freed: seq_rm's range, a tree's cells, or a restore"),
          ("kv-next", "target's token: written next round"))


def cell_class(pos: int, ev, prompt_len: int) -> tuple[str, str]:
    """(css class, label) of a confirmed cell at `pos` after round `ev`."""
    if ev.kind != "prefill" and pos == ev.pos_sampled:
        return "kv-sampled", "last round's token, written in this round's batch"
    if ev.p0 <= pos < ev.p0 + ev.n_accepted:
        return "kv-acc", f"draft d{pos - ev.p0 + 1} appended this round and kept"
    if pos < prompt_len:
        return "kv-prompt", "prompt"
    return "kv-gen", "answer, confirmed in an earlier round"


def cell(cls: str, pos: int | str, piece: str, label: str) -> str:
    return (f'<span class="kv {cls}" data-tip="{tip([f"cell at position {pos}", label, repr(piece)])}">'
            f'<span class="kv-tok">{short(piece)}</span><span class="kv-pos">{pos}</span></span>')


def kv_html(ev, cache_ids: list[int], prompt_len: int, vocab: Vocab, n_ctx: int | None = None,
            window: int = WINDOW) -> str:
    """The strip for the latest event. `cache_ids` are the tokens in the sequence's cells after the round
    (prompt + answer except the target's newest token), `prompt_len` how many of them are the prompt."""
    if ev is None:
        return '<div class="kvview muted">The cache appears here after the first round.</div>'
    n = ev.seq_cells or len(cache_ids)
    k = len(ev.drafted)
    window = max(window, k + 8)
    start = max(0, n - window)
    ids = cache_ids[start:n]
    pieces = vocab.pieces(cache_ids[max(0, start - 4):start], ids)
    cells = []
    if start > 0:
        n_prompt = min(start, prompt_len)
        cells.append(f'<span class="kv kv-fold" data-tip="{tip([f"cells 0..{start - 1}"])}">0&ndash;{start - 1}'
                     f'<br><small>{n_prompt} prompt, {start - n_prompt} answer</small></span>')
    for pos, piece in zip(range(start, n), pieces):
        cls, label = cell_class(pos, ev, prompt_len)
        cells.append(cell(cls, pos, piece, label))
    cells += freed_cells(ev, cache_ids[max(0, n - 4):n], vocab)
    if len(ev.emitted) > ev.n_accepted and not ev.done:  # a finished answer writes no further token
        piece = vocab.pieces(cache_ids[max(0, n - 4):n], [ev.emitted[-1]])[0]
        cells.append(cell("kv-next", ev.p0 + ev.n_accepted, piece, "the target's token: sampled, not cached yet"))
    return (f'<div class="kvview">{kv_caption(ev, n, k, n_ctx)}<div class="kv-strip">{"".join(cells)}</div>'
            f'{kv_legend()}</div>')


def freed_cells(ev, context: list[int], vocab: Vocab) -> list[str]:
    """The cells this round's rollback took out, each labelled with how it left (RoundEvent.rollback)."""
    if ev.rollback == "seq_rm" and ev.rm_range is not None:
        a, b = ev.rm_range
        how = f"freed by seq_rm [{a}, {b})"
        return [cell("kv-freed", a + i, piece, f"rejected draft d{ev.n_accepted + i + 1}: {how}")
                for i, piece in enumerate(vocab.pieces(context, ev.rejected)[: b - a])]
    if ev.rollback == "tree":
        on_path, parents = set(ev.tree_path), ev.tree_parents
        depth = [0] * len(parents)
        for node, parent in enumerate(parents):
            depth[node] = 1 if parent < 0 else depth[parent] + 1
        off = sorted((node for node in range(len(parents)) if node not in on_path), key=lambda node: depth[node])
        return [cell("kv-freed", pos, vocab.pieces(context, [ev.tree_tokens[node]])[0],
                     f"tree node {node} by {ev.tree_drafters[node]}, off the target's path: its cell freed alone")
                for node, pos in zip(off, ev.rm_positions)]
    if ev.rollback == "checkpoint" and ev.kind != "replay" and ev.rm_range is not None:
        a = ev.rm_range[0]
        drafts = vocab.pieces(context, ev.drafted)[: ev.rm_cells - 1]
        how = "left with the checkpoint restore"
        return ([cell("kv-freed", a, "", f"last round's token: {how}, replayed next round")]
                + [cell("kv-freed", a + 1 + i, piece, f"draft d{i + 1}: {how}"
                        + (", replayed next round" if i < ev.n_accepted else ""))
                   for i, piece in enumerate(drafts)])
    return []


def kv_caption(ev, n: int, k: int, n_ctx: int | None) -> str:
    used = f" · cache {ev.n_cells_used}/{n_ctx} cells used by all sessions" if n_ctx and ev.n_cells_used else ""
    if ev.kind == "prefill":
        what = f"prefill wrote {ev.batch_rows} prompt cells"
    elif ev.kind == "replay":
        what = f"replay wrote the decided tokens back from {ev.pos_sampled} after last round's restore"
    elif k == 0:
        what = f"appended 1 cell at {ev.pos_sampled} (no draft)"
    elif ev.verify_mode == "tree":
        what = (f"appended {1 + len(ev.tree_tokens)} cells (the sampled token and the tree's "
                f"{len(ev.tree_tokens)} nodes), kept the path's {ev.n_accepted} node(s)")
    else:
        what = f"appended {k + 1} cells at {ev.pos_sampled}..{ev.p0 + k - 1}, kept {ev.n_accepted} draft(s)"
    what += rollback_words(ev)
    return (f'<div class="kv-caption">Sequence {ev.seq}, round {ev.round}: {html.escape(what)}; '
            f'{n} cells after the round{used}</div>')


def rollback_words(ev) -> str:
    """The caption's words for how the rejected cells left, by the engine's own word (RoundEvent.rollback)."""
    if ev.rollback == "seq_rm" and ev.rm_range is not None:
        rs = f", {ev.rs_undone} recurrent step(s) undone" if ev.rs_undone else ""
        return f", seq_rm [{ev.rm_range[0]}, {ev.rm_range[1]}){rs}"
    if ev.rollback == "tree":
        return f", {ev.rm_cells} branch cell(s) freed one by one"
    if ev.rollback == "checkpoint" and ev.kind != "replay":
        return f", restore: all {ev.rm_cells} cell(s) left, replay next round"
    return ""


def kv_legend() -> str:
    return '<div class="kv-legend">' + "".join(
        f'<span><span class="kv-swatch {cls}"></span>{html.escape(text)}</span>' for cls, text in LEGEND) + "</div>"
