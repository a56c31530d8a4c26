"""A tree of draft tokens: several continuations checked in one target forward.

Node i holds `tokens[i]` one position below its parent `parents[i]` (-1: directly after id_last, the token
sampled last round). Shared prefixes are stored once, so a chain from ngram-map-k and one from the draft head
that agree on their first tokens cost those rows once. Parents always come before their children, so node
order is a valid order of rows in a batch.

In the target's forward the round's rows are [id_last, node 0, node 1, ...]: row 0 is the root and node i is
row i + 1 at position p_sampled + 1 + depth(i). Each row attends to the committed sequence and to its own
ancestors only: the batch carries parent links (`Batch.parent`) and the cell cache builds that mask
(memory.py); a tree mask from parent links needs no extra sequence ids, where branch sequences (`seq_cp` per
branch) would spend `n_seq_max` on drafts. The target then walks the tree with its own tokens (verify.py:
`tree_match`): from the root, draw the target's token; if a child holds it, keep it and go on from that child's
row; else that token is the round's last. Exactly the draws of plain sampling, one per emitted token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SampledChain:
    """A chain a drafter drew from its own distributions at temperature > 0, kept whole whatever part of it became
    nodes: verification tests every token of it that hangs below the target's path (engine/round/tree_rejection.py),
    since dropping a draw for its value (the budget's cut, the node limit) would tilt the output."""
    drafter: str
    tokens: list[int]
    q: list[torch.Tensor]  # q[i]: the distribution [V] tokens[i] was drawn from, given tokens[:i]


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)  # token of node i
    parents: list[int] = field(default_factory=list)  # parent node of node i, -1 for a child of the root
    drafters: list[str] = field(default_factory=list)  # drafter that first proposed node i
    # estimated chance that the target's walk reaches node i (a model drafter's cumulative probability, an
    # n-gram drafter's acceptance rates multiplied along the path): what the round's budget ranks nodes by
    scores: list[float] = field(default_factory=list)
    # drafter -> the nodes it proposed, parents before children: how much of *its* draft was kept is its credit
    proposals: dict[str, list[int]] = field(default_factory=dict)
    # the chains drawn from a drafter's q (temperature > 0), in relay order: rejection sampling over the tree
    sampled: list[SampledChain] = field(default_factory=list)
    # node -> its children by token; rebuilt from parents when needed
    _children: dict[int, dict[int, int]] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, node: int, token: int) -> int | None:
        """The child of `node` (-1: the root) holding `token`, or None."""
        return self._children.get(node, {}).get(token)

    def children(self, node: int) -> list[int]:
        return list(self._children.get(node, {}).values())

    def add(self, parent: int, token: int, drafter: str, score: float = 0.0) -> int:
        """The node for `token` under `parent`: the existing one (its score raised to `score` if higher), or a
        new one proposed by `drafter`."""
        found = self.child(parent, token)
        if found is not None:
            self.scores[found] = max(self.scores[found], score)
            return found
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.drafters.append(drafter)
        self.scores.append(float(score))
        node = len(self.tokens) - 1
        self._children.setdefault(parent, {})[int(token)] = node
        return node

    def add_chain(self, tokens: list[int], drafter: str, parent: int = -1, limit: int | None = None,
                  scores: list[float] | None = None) -> list[int]:
        """Merge a chain of tokens under `parent`; stop before the tree would exceed `limit` nodes. Returns the
        chain's nodes (the part that fitted) and records them as `drafter`'s proposal."""
        nodes = []
        for i, tok in enumerate(tokens):
            if self.child(parent, tok) is None and limit is not None and len(self) >= limit:
                break
            parent = self.add(parent, tok, drafter, scores[i] if scores else 0.0)
            nodes.append(parent)
        self._propose(drafter, nodes)
        return nodes

    def add_tree(self, other: "DraftTree", drafter: str, limit: int | None = None) -> list[int]:
        """Merge another tree (a model drafter's) node by node, parents first; a node whose parent did not fit
        is dropped with its subtree. Returns the merged nodes."""
        where: dict[int, int] = {-1: -1}
        nodes = []
        for i, (tok, parent) in enumerate(zip(other.tokens, other.parents)):
            if parent not in where:
                continue
            if self.child(where[parent], tok) is None and limit is not None and len(self) >= limit:
                continue
            where[i] = self.add(where[parent], tok, drafter, other.scores[i])
            nodes.append(where[i])
        self._propose(drafter, nodes)
        return nodes

    def _propose(self, drafter: str, nodes: list[int]) -> None:
        if nodes:
            mine = self.proposals.setdefault(drafter, [])
            mine += [n for n in nodes if n not in mine]

    def bound_scores(self) -> None:
        """Make the scores chances the walk can have: it takes at most one child of a node, so the children's
        scores add up to at most their parent's (the root's is 1). Merged proposals break that where drafters
        disagree (two of them each 60% sure of a different next token); such a family is scaled down to its
        parent's score, and each subtree with its root. Parents come before children in node order."""
        factor = [1.0] * len(self)  # how much each node was scaled, handed on to its children
        kids: dict[int, list[int]] = {}
        for v, parent in enumerate(self.parents):
            kids.setdefault(parent, []).append(v)
        for parent in [-1] + list(range(len(self))):
            family = kids.get(parent, [])
            if not family:
                continue
            inherited = factor[parent] if parent >= 0 else 1.0
            cap = self.scores[parent] if parent >= 0 else 1.0
            for v in family:
                self.scores[v] *= inherited
                factor[v] = inherited
            total = sum(self.scores[v] for v in family)
            if total > cap:
                shrink = cap / total
                for v in family:
                    self.scores[v] *= shrink
                    factor[v] *= shrink
            for v in family:  # rounding must not let a child outscore its parent: rankings take parents first
                self.scores[v] = min(self.scores[v], cap)

    def depth(self, node: int) -> int:
        """1 for a child of the root."""
        d = 0
        while node >= 0:
            node, d = self.parents[node], d + 1
        return d

    def path(self, node: int) -> list[int]:
        """Nodes from the root's child down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def is_chain(self) -> bool:
        """Every node has at most one child: node i is the child of node i - 1."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def max_depth(self) -> int:
        return max((self.depth(i) for i in range(len(self))), default=0)

    def n_leaves(self) -> int:
        return sum(1 for i in range(len(self)) if not self._children.get(i))

    def credit(self, path: list[int]) -> dict[str, tuple[int, int]]:
        """drafter -> (its draft's depth, how many of the kept path's tokens it had proposed, from the first) for
        an accepted `path`: a chain's (length, accepted prefix), as llama.cpp counts a draft."""
        out = {}
        for name, nodes in self.proposals.items():
            mine = set(nodes)
            m = 0
            while m < len(path) and path[m] in mine:
                m += 1
            out[name] = (max(self.depth(n) for n in nodes), m)
        return out

    def keep(self, nodes: list[int]) -> "DraftTree":
        """The tree of only these nodes (with every ancestor of them), renumbered parents first."""
        wanted = set()
        for n in nodes:
            while n >= 0 and n not in wanted:
                wanted.add(n)
                n = self.parents[n]
        out = DraftTree()
        where = {-1: -1}
        for i in sorted(wanted):
            where[i] = out.add(where[self.parents[i]], self.tokens[i], self.drafters[i], self.scores[i])
        for name, mine in self.proposals.items():
            out._propose(name, [where[n] for n in mine if n in where])
        out.sampled = list(self.sampled)
        return out

    @staticmethod
    def chain(tokens: list[int], drafter: str) -> "DraftTree":
        tree = DraftTree()
        tree.add_chain(tokens, drafter)
        return tree


def tree_rows(batch, tree: DraftTree, id_last: int, pos: int, seq: int) -> list[int]:
    """Add the root (id_last at `pos`) and every node of `tree` to `batch`; returns the batch rows, root first."""
    rows = [batch.add(id_last, pos, seq, True)]
    depth = [0]
    for tok, parent in zip(tree.tokens, tree.parents):
        d = depth[parent + 1] + 1
        depth.append(d)
        rows.append(batch.add(tok, pos + d, seq, True, parent=rows[parent + 1]))
    return rows


def sub_batch(batch, result, rows: list[int]):
    """The rows of a forward that stayed in the cache, as a batch and result of their own, for the drafters that
    mirror the target's forwards (Drafter.process: the draft head reads hidden states by position). The result
    carries no logits: no drafter reads them there, and copying the kept rows' logits (a vocabulary's floats
    each) was a measurable part of a round of four copying slots
    (docs/history.md#a-forwards-and-a-rounds-fixed-costs)."""
    from engine.batch import Batch
    from engine.memory.context import DecodeResult

    out = Batch()
    for i in rows:
        out.add(batch.tokens[i], batch.pos[i], batch.seq[i], batch.output[i])
    hidden = None if result.hidden is None else result.hidden[rows]
    return out, DecodeResult(logits=None, seconds=result.seconds, hidden=hidden, layers=result.layers)
