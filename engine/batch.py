"""A batch of tokens for one forward, in llama.cpp's shape: every row has a token, a position and a sequence."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Batch:
    tokens: list[int] = field(default_factory=list)  # token id per row
    pos: list[int] = field(default_factory=list)  # position of the row within its sequence
    seq: list[int] = field(default_factory=list)  # sequence id of the row
    output: list[bool] = field(default_factory=list)  # whether the row's logits are wanted
    # per row: None, it sees the rows of its sequence at positions up to its own (a chain); or the batch index
    # of its parent in a draft tree, and it sees its ancestors' rows and itself only (engine/draft/tree.py)
    parent: list[int | None] = field(default_factory=list)

    def add(self, token: int, pos: int, seq: int, output: bool, parent: int | None = None) -> int:
        """Append a row; return its index in the batch."""
        if parent is not None and not (0 <= parent < len(self.tokens) and self.seq[parent] == seq
                                       and self.pos[parent] == pos - 1):
            raise ValueError(f"row at position {pos} of sequence {seq}: parent row {parent} is not an earlier row "
                             "of the same sequence one position before it")
        self.tokens.append(int(token))
        self.pos.append(int(pos))
        self.seq.append(int(seq))
        self.output.append(bool(output))
        self.parent.append(parent)
        return len(self.tokens) - 1

    def has_tree(self) -> bool:
        return any(p is not None for p in self.parent)

    def ancestors(self):
        """Bool [T, T]: row u is row t or one of its ancestors, for tree rows t (None if no row has a parent)."""
        import torch

        if not self.has_tree():
            return None
        n = len(self)
        anc = torch.eye(n, dtype=torch.bool, device="cpu")
        for t, p in enumerate(self.parent):
            if p is not None:
                anc[t] |= anc[p]  # parents come first, so the parent's row is complete
        return anc

    def __len__(self) -> int:
        return len(self.tokens)

    def output_rows(self) -> list[int]:
        return [i for i, o in enumerate(self.output) if o]


def check_batch(batch: Batch, n_outputs_max: int | None) -> None:
    """Refuse what a context cannot run: no rows, or more logits rows than it reserved."""
    if len(batch) == 0:
        raise ValueError("empty batch")
    n_out = sum(batch.output)
    if n_outputs_max is not None and n_out > n_outputs_max:
        raise ValueError(f"batch asks for {n_out} logits rows, the context reserves {n_outputs_max}")


@dataclass
class OutputLimits:
    total: int  # logits rows one forward may return, over all sequences (llama.cpp's n_outputs_max)
    per_seq: int  # logits rows one sequence may ask for in a forward: its sampled token and its draft


def output_limits(n_batch: int, n_parallel: int, n_draft: int) -> OutputLimits:
    """common_speculative_get_output_limits: every slot verifies 1 + n_draft rows, capped by the batch size.

    The logits buffer is sized for concurrency x draft depth; a verification asking for more than this gets
    its draft shortened rather than failing."""
    per_seq = 1 + max(0, n_draft)
    return OutputLimits(total=min(n_batch, n_parallel * per_seq), per_seq=min(n_batch, per_seq))
