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
