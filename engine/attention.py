"""Attention over the cell cache, one sequence at a time.

The cell cache hands every layer the K/V of all live cells, and the 4D mask hides the cells of other
sequences. That is right, but with several slots each row then scores every slot's cells, and transformers'
SDPA path copies K/V once per query head (`repeat_kv`) for any batch of more than one row, so a step of 4 slots
costs several times one slot's (docs/engine.md has the figures). Here the rows of each sequence attend only to the
cells that sequence can see (a slice when they are contiguous, which they usually are), with grouped-query
attention done inside the kernel (`enable_gqa`), so a batched step costs about what its weights cost.

The engine passes `cell_groups` (from CellCache.prepare) as a forward kwarg, which transformers hands to the
attention function; a forward without it (a plain HF call on the same model) takes the normal SDPA path.
"""

from __future__ import annotations

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
    gqa = query.shape[1] != key.shape[1]
    if any(not isinstance(cells, slice) for _, cells, _ in groups):
        # scattered cells: gathering them costs more than scoring every live cell once, under the full mask
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                             enable_gqa=gqa)
    elif len(groups) == 1:
        _, cells, mask = groups[0]
        out = F.scaled_dot_product_attention(query, key[:, :, cells], value[:, :, cells], attn_mask=mask,
                                             scale=scaling, enable_gqa=gqa)
    else:
        out = torch.empty_like(query)
        for rows, cells, mask in groups:
            out[:, :, rows] = F.scaled_dot_product_attention(
                query[:, :, rows], key[:, :, cells], value[:, :, cells], attn_mask=mask, scale=scaling,
                enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


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


def cell_groups(mask: torch.Tensor, seq: torch.Tensor, visible_cells: torch.Tensor) -> list:
    """Per sequence of the batch: (its rows, the cells it may see, their mask block [1, 1, T_s, C_s]).

    mask: [1, 1, T, n_live] the full additive mask; seq: [T] sequence id per row; visible_cells: [n_live, n_seq]
    bool, cell holds that sequence."""
    groups = []
    unique = seq.unique(sorted=False).tolist()
    for s in unique:
        rows = _as_slice(torch.nonzero(seq == s).flatten()) if len(unique) > 1 else slice(None)
        cells = _as_slice(torch.nonzero(visible_cells[:, s]).flatten())
        block = mask[:, :, rows] if isinstance(rows, slice) else mask[:, :, rows.to(mask.device)]
        block = block[..., cells] if isinstance(cells, slice) else block[..., cells.to(mask.device)]
        if not isinstance(cells, slice):
            cells = cells.to(mask.device)
        if not isinstance(rows, slice):
            rows = rows.to(mask.device)
        groups.append((rows, cells, block))
    return groups
