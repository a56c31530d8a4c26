"""A batch of tokens for one forward, in llama.cpp's shape: every row has a token, a position and a sequence."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Batch:
    tokens: list[int] = field(default_factory=list)  # token id per row
    pos: list[int] = field(default_factory=list)  # position of the row within its sequence
    seq: list[int] = field(default_factory=list)  # sequence id of the row
    output: list[bool] = field(default_factory=list)  # whether the row's logits are wanted

    def add(self, token: int, pos: int, seq: int, output: bool) -> int:
        """Append a row; return its index in the batch."""
        self.tokens.append(int(token))
        self.pos.append(int(pos))
        self.seq.append(int(seq))
        self.output.append(bool(output))
        return len(self.tokens) - 1

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
