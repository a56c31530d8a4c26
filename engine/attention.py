"""Attention over the cell cache, one sequence at a time.

The cell cache hands every layer the K/V of all live cells, and the 4D mask hides the cells of other
sequences. That is right, but with several slots each row then scores every slot's cells, and transformers'
SDPA path copies K/V once per query head (`repeat_kv`) for any batch of more than one row, so a step of 4 slots
costs several times one slot's (docs/engine.md has the figures). Here the rows of each sequence attend only to the
cells that sequence can see (a slice when they are contiguous, which they usually are), with no key repeated
per query head, so a batched step costs about what its weights cost.

Every row attends alone, over exactly the cells it sees (one run of the cache, or its scattered cells gathered in
position order), without a mask. That is the very call plain
decoding makes for the same position, so a row's attention does not depend on the batch it ran in: torch's
SDPA is not batch-invariant (a row scored beside others, or over masked extra cells, comes out a rounding
apart, which bfloat16 turns into logits half a unit apart). With the packed linears (engine/prepack.py), also
batch-invariant, a verification forward reproduces plain decoding's logits exactly, and a prompt prefilled at
once leaves the cache a prompt prefilled in parts (a reused prefix, then the rest) leaves; so greedy
speculation and prefix reuse are token-identical in any dtype. The price is one attention call per row (grouped-query
heads folded into it, so keys are never repeated): a prompt's prefill and a deep verification cost more than
one batched call (docs/engine.md).

The engine passes `cell_groups` (from CellCache.prepare) as a forward kwarg, which transformers hands to the
attention function; a forward without it (a plain HF call on the same model) takes the normal SDPA path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

NAME = "spec_cells"  # the attention implementation name registered with transformers


def cell_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query [1, H, T, D]; key, value [1, H_kv, n_live, D] -> ([1, T, H, D], None), like sdpa_attention_forward."""
    groups = kwargs.get("cell_groups")
    if groups is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return attend(query, key, value, groups, scaling).transpose(1, 2).contiguous(), None


def attend(query, key, value, groups: list["SeqGroup"], scaling) -> torch.Tensor:
    """query [1, H, T, D]; key, value [1, H_kv, n_live, D]; groups from cell_groups -> [1, H, T, D].

    Each row alone over the cells it sees: a slice of the cache, or its scattered cells gathered in position
    order (a prefix shared with another sequence)."""
    if len(groups) == 1 and len(groups[0].row_cells) == 1:
        cells = groups[0].row_cells[0][1]  # one decode step
        return _one_row(query, _take(key, cells), _take(value, cells), scaling)
    out = torch.empty_like(query)
    for group in groups:
        for row, cells in group.row_cells:
            out[:, :, row:row + 1] = _one_row(query[:, :, row:row + 1], _take(key, cells), _take(value, cells),
                                              scaling)
    return out


def _take(kv: torch.Tensor, cells: slice | torch.Tensor) -> torch.Tensor:
    return kv[:, :, cells] if isinstance(cells, slice) else kv.index_select(2, cells)


def use_cell_attention(model) -> bool:
    """Switch a model to cell attention if it runs attention through transformers' interface; True if it did."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    current = getattr(model.config, "_attn_implementation", None)
    if current == NAME:
        return True  # another context on the same model switched it already
    if current != "sdpa":
        return False  # eager, flash or a custom kernel: leave the model as it was configured
    AttentionInterface.register(NAME, cell_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(NAME)
    return True


def _as_slice(idx: torch.Tensor):
    """A slice if the indices are one increasing run (no copy when indexing), else the index tensor."""
    n = idx.numel()
    if n and int(idx[-1]) - int(idx[0]) + 1 == n and bool((idx[1:] > idx[:-1]).all()):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


def _one_row(query, key, value, scaling) -> torch.Tensor:
    """One row: query [1, H, 1, D] over key, value [1, H_kv, n, D] -> [1, H, 1, D].

    With grouped-query attention the H / H_kv query heads that share a key head are folded into the query
    length ([1, H_kv, H / H_kv, D]: head h reads key head h // (H / H_kv), transformers' repeat_kv order), so
    no key or value is repeated or gathered; every row, in any batch, takes this same call."""
    h, h_kv, d = query.shape[1], key.shape[1], query.shape[-1]
    if h == h_kv:
        return F.scaled_dot_product_attention(query, key, value, scale=scaling)
    out = F.scaled_dot_product_attention(query.reshape(1, h_kv, h // h_kv, d), key, value, scale=scaling)
    return out.reshape(1, h, 1, d)


class SeqGroup(NamedTuple):
    rows: slice | torch.Tensor  # the batch rows of one sequence
    cells: slice | torch.Tensor  # the cells that sequence may see
    # per row (batch index, the cells it sees: one run as a slice, else their indices in position order)
    row_cells: list[tuple[int, slice | torch.Tensor]]


def _row_cells(rows: slice | torch.Tensor, n_rows: int, cells: slice | torch.Tensor, block: torch.Tensor,
               cell_pos: torch.Tensor | None) -> list[tuple[int, slice | torch.Tensor]]:
    """(row, the cells it sees) per row: a slice for one contiguous run, else indices sorted by position, so
    the keys reach the kernel in the same order wherever a prefix is stored (a prefix shared with seq_cp)."""
    row_ids = list(range(n_rows))[rows] if isinstance(rows, slice) else rows.tolist()
    seen = block[0, 0] == 0  # [T_s, C_s]
    out = []
    for j, row in enumerate(row_ids):
        idx = torch.nonzero(seen[j]).flatten()
        idx = idx + cells.start if isinstance(cells, slice) else cells[idx]
        if cell_pos is not None:
            idx = idx[torch.argsort(cell_pos[idx], stable=True)]
        out.append((row, _as_slice(idx)))
    return out


def cell_groups(mask: torch.Tensor, seq: torch.Tensor, visible_cells: torch.Tensor,
                cell_pos: torch.Tensor | None = None) -> list[SeqGroup]:
    """Per sequence of the batch: its rows, the cells it may see, and the cells each row sees.

    mask: [1, 1, T, n_live] the full additive mask; seq: [T] sequence id per row; visible_cells: [n_live, n_seq]
    bool, cell holds that sequence; cell_pos: [n_live] position per cell. row_cells lets each row attend alone
    over exactly the cells it sees."""
    groups = []
    unique = seq.unique(sorted=False).tolist()
    for s in unique:
        rows = _as_slice(torch.nonzero(seq == s).flatten()) if len(unique) > 1 else slice(None)
        cells = _as_slice(torch.nonzero(visible_cells[:, s]).flatten())
        block = mask[:, :, rows] if isinstance(rows, slice) else mask[:, :, rows.to(mask.device)]
        block = block[..., cells] if isinstance(cells, slice) else block[..., cells.to(mask.device)]
        row_cells = _row_cells(rows, len(seq), cells, block.cpu(), cell_pos)
        if not isinstance(cells, slice):
            cells = cells.to(mask.device)
        if not isinstance(rows, slice):
            rows = rows.to(mask.device)
        groups.append(SeqGroup(rows, cells, row_cells))
    return groups
