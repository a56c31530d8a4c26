"""Attention over the cell cache in one call per layer: every row of a forward against the union of the cells
its rows see, with a mask that keeps each row to its own.

The per-row paths of engine/forward/attention.py make a row's output independent of its batch (lossless to the
bit) at the price of one call per row per layer. On a card that price is the whole forward: the launches of
T rows x L layers small calls, where the arithmetic of all rows together takes about what one row's takes (a
decoding forward there waits on the weights' bytes, not on the rows). So off the CPU the engine attends over
the union: one SDPA call per layer with a boolean mask of [T, n_union].

What it gives up: a row scored beside others (over masked extra cells) can come out a rounding apart from the
same row alone, so speculation there is lossless to the rounding of the card's kernels, not to the bit;
scripts/gpu_check.py measures token identity with plain decoding on the card. Masked cells take no part in a
row's softmax (their probability is exactly zero), so the sums differ only in how a kernel blocks them.

Shapes: T rows of a forward, H query heads and H_kv key heads of D, U cells in the union (ascending cell order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class UnionCells:
    """One forward's rows over the union of their cells, on the device of the keys they read."""

    cells: slice | torch.Tensor  # the union's cells: a slice when they form one run, else [U] int64
    mask: torch.Tensor  # [T, U] bool: True where row r sees the union's cell j


def union_of(row_ptr: torch.Tensor, cells: torch.Tensor, device: torch.device) -> UnionCells:
    """The union of every row's cells and the mask of who sees what: row_ptr [T + 1], cells [n_seen] (a
    CellLayout's compressed rows, on the CPU)."""
    ptr, flat = row_ptr.numpy(), cells.numpy()
    n_rows = ptr.size - 1
    union = np.unique(flat)  # ascending
    mask = np.zeros((n_rows, union.size), dtype=bool)
    rows = np.repeat(np.arange(n_rows), np.diff(ptr))
    mask[rows, np.searchsorted(union, flat)] = True
    if union.size and int(union[-1]) - int(union[0]) + 1 == union.size:
        picked: slice | torch.Tensor = slice(int(union[0]), int(union[-1]) + 1)
    else:
        picked = torch.from_numpy(union.astype(np.int64)).to(device)
    return UnionCells(picked, torch.from_numpy(mask).to(device))


def attend_union(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float, union: UnionCells,
                 softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """query [T, H, D]; key, value [1, H_kv, n_live, D] -> [T, H, D]: softmax(q k^T * scale) v over each row's
    cells, all rows in one call. softcap: scores become softcap * tanh(score / softcap); sinks [H]: one extra
    logit per head in the softmax, dropped after it."""
    n_rows, h, d = query.shape
    if n_rows == 0:
        return torch.empty_like(query)
    k, v = _take(key, union.cells), _take(value, union.cells)  # [1, H_kv, U, D]
    q = query.transpose(0, 1)[None].to(k.dtype)  # [1, H, T, D]
    if softcap is None and sinks is None:
        h_kv = k.shape[1]
        # grouped-query heads: head i reads key head i // (H / H_kv), transformers' repeat_kv order
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=union.mask[None, None], scale=scaling,
                                             enable_gqa=h_kv != h)
    else:
        out = _scored(q, k, v, scaling, union.mask, softcap, sinks)
    return out[0].transpose(0, 1).to(query.dtype)  # [T, H, D]


def _scored(q, k, v, scaling, mask, softcap, sinks) -> torch.Tensor:
    """The same with soft-capped scores and/or sink logits, in float32: q [1, H, T, D]; k, v [1, H_kv, U, D]."""
    h, h_kv = q.shape[1], k.shape[1]
    k, v = k.float().repeat_interleave(h // h_kv, 1), v.float().repeat_interleave(h // h_kv, 1)
    scores = (q.float() @ k.transpose(-1, -2)) * scaling  # [1, H, T, U]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask[None, None], float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(1, h, 1, 1).expand(1, h, scores.shape[2], 1)
        both = torch.cat([scores, sink], dim=-1)
        probs = torch.softmax(both - both.amax(-1, keepdim=True), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return (probs @ v).to(q.dtype)


def _take(kv: torch.Tensor, cells: slice | torch.Tensor) -> torch.Tensor:
    """[1, H_kv, n_live, D] -> [1, H_kv, U, D]: a view for a slice, a gather otherwise."""
    return kv[:, :, cells] if isinstance(cells, slice) else kv.index_select(2, cells)
