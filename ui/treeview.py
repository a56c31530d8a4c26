"""A round's tree of drafts as HTML: every node with its drafter, the path the target took (green), the branches
it did not take (struck), and where each node's cell went; plus the round's budget line.

Pure functions of a RoundEvent whose verify_mode is "tree" (engine/draft/tree.py): tree_tokens, tree_parents,
tree_drafters and tree_path describe the tree as it was verified.
"""

from __future__ import annotations

import html

from ui.tokens import Vocab, tip, visible


def _children(parents: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        out.setdefault(parent, []).append(node)
    return out


def _depths(parents: list[int]) -> list[int]:
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


def _paths(parents: list[int], tokens: list[int]) -> list[list[int]]:
    """Per node, the tokens from the root's child down to it (to decode each node after its own prefix)."""
    out: list[list[int]] = []
    for node, parent in enumerate(parents):
        out.append(([] if parent < 0 else out[parent]) + [tokens[node]])
    return out


def node_label(ev, node: int, depth: int, on_path: bool) -> str:
    pos = ev.pos_sampled + depth
    where = (f"kept in the cache at position {pos}" if on_path
             else f"cell at position {pos} freed (not the target's token)")
    return tip([f"node {node}, depth {depth}", f"by {ev.tree_drafters[node]}", f"token {ev.tree_tokens[node]}",
                where])


def tree_html(ev, vocab: Vocab, context: list[int]) -> str:
    """The tree as nested lists under the round's sampled token."""
    if not ev.tree_tokens:
        return ""
    parents, tokens = ev.tree_parents, ev.tree_tokens
    kids, depths, paths = _children(parents), _depths(parents), _paths(parents, tokens)
    on_path = set(ev.tree_path)

    def subtree(parent: int) -> str:
        items = []
        for node in kids.get(parent, []):
            piece = vocab.pieces(context + paths[node][:-1], [tokens[node]])[0]
            text = visible(piece, inline=True)
            cls = "chip-acc" if node in on_path else "chip-rej"
            chip = f'<span class="chip {cls}" data-tip="{node_label(ev, node, depths[node], node in on_path)}">'
            chip += (text if node in on_path else f"<s>{text}</s>") + "</span>"
            tag = f'<span class="muted tree-by">{html.escape(ev.tree_drafters[node])}</span>'
            items.append(f"<li>{chip}{tag}{subtree(node)}</li>")
        return f'<ul class="tree">{"".join(items)}</ul>' if items else ""

    n_branches = sum(1 for node in range(len(tokens)) if node not in kids) - 1
    head = (f'<p><b>Tree of {len(tokens)} nodes</b> (depth {max(depths)}, {max(n_branches, 0)} branches not '
            f'taken besides the path): the target kept {len(ev.tree_path)} and added its own token. Green: the '
            f'path it took, in the cache; struck: the branches whose cells were freed.</p>')
    return f'<div class="tree-view">{head}{subtree(-1)}{budget_line(ev)}</div>'


def budget_line(ev) -> str:
    if not ev.budget_why:
        return ""
    mine = (f" This slot: {len(ev.tree_tokens)} of the {ev.tree_offered} nodes its drafters offered."
            if ev.tree_offered else "")
    if ev.balance is not None:  # what the fair budget weighs for this slot (engine/budget/tree_budget.py)
        mine += (f" Its answer stands {ev.balance:+.1f} tokens against plain decoding in the same forward "
                 f"time.")
    return f'<p class="muted">Budget of the round: {html.escape(ev.budget_why)}.{mine}</p>'


def tree_summary(ev) -> str:
    """The timeline's short note on a tree round."""
    if not ev.tree_tokens:
        return ""
    return (f' <span class="muted" data-tip="{tip([ev.budget_why or "no budget (adaptive off)"])}">'
            f'(tree: {len(ev.tree_tokens)} nodes)</span>')
