"""Attention over the cell cache, one sequence at a time.

The cell cache hands every layer the K/V of all live cells, and the 4D mask hides the cells of other
sequences. That is right, but with several slots each row then scores every slot's cells, and transformers'
SDPA path copies K/V once per query head (`repeat_kv`) for any batch of more than one row, so a step of 4 slots
costs several times one slot's (docs/engine.md has the figures). Here the rows of each sequence attend only to the
cells that sequence can see (a slice when they are contiguous, which they usually are), with grouped-query
attention done inside the kernel (`enable_gqa`), so a batched step costs about what its weights cost.

Every row attends alone, over exactly the run of cells it sees, without a mask. That is the very call plain
decoding makes for the same position, so a row's attention does not depend on the batch it ran in: torch's
SDPA is not batch-invariant (a row scored beside others, or over masked extra cells, comes out a rounding
apart, which bfloat16 turns into logits half a unit apart). With the packed linears (engine/prepack.py), also
batch-invariant, a verification forward reproduces plain decoding's logits exactly, and a prompt prefilled at
once leaves the cache a prompt prefilled in parts (a reused prefix, then the rest) leaves; so greedy
speculation and prefix reuse are token-identical in any dtype. The price is one attention call per row: a
prompt's prefill costs 1.3x (64 tokens) to 1.9x (1024 tokens) the batched call (docs/engine.md); a decode step
or a verification costs the same. Rows whose cells are scattered (no single run) attend batched under the
mask.

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
    return attend(query, key, value, attention_mask, groups, scaling).transpose(1, 2).contiguous(), None


def attend(query, key, value, attention_mask, groups: list["SeqGroup"], scaling) -> torch.Tensor:
    """query [1, H, T, D]; key, value [1, H_kv, n_live, D]; groups from cell_groups -> [1, H, T, D]."""
    gqa = query.shape[1] != key.shape[1]
    if len(groups) == 1 and groups[0].row_cells is not None and len(groups[0].row_cells) == 1:
        cells = groups[0].row_cells[0][1]  # one decode step: its row over exactly the cells it sees
        return F.scaled_dot_product_attention(query, key[:, :, cells], value[:, :, cells], scale=scaling,
                                              enable_gqa=gqa)
    if any(g.row_cells is None and not isinstance(g.cells, slice) for g in groups):
        # scattered cells: gathering them costs more than scoring every live cell once, under the full mask
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=scaling,
                                              enable_gqa=gqa)
    if len(groups) == 1 and groups[0].row_cells is None:
        _, cells, mask, _ = groups[0]
        return F.scaled_dot_product_attention(query, key[:, :, cells], value[:, :, cells], attn_mask=mask,
                                              scale=scaling, enable_gqa=gqa)
    out = torch.empty_like(query)
    for rows, cells, mask, row_cells in groups:
        if row_cells is not None:
            for row, seen in row_cells:
                out[:, :, row:row + 1] = F.scaled_dot_product_attention(
                    query[:, :, row:row + 1], key[:, :, seen], value[:, :, seen], scale=scaling, enable_gqa=gqa)
            continue
        out[:, :, rows] = F.scaled_dot_product_attention(
            query[:, :, rows], key[:, :, cells], value[:, :, cells], attn_mask=mask, scale=scaling,
            enable_gqa=gqa)
    return out


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


class SeqGroup(NamedTuple):
    rows: slice | torch.Tensor  # the batch rows of one sequence
    cells: slice | torch.Tensor  # the cells that sequence may see
    mask: torch.Tensor  # their mask block [1, 1, T_s, C_s]
    row_cells: list[tuple[int, slice]] | None  # per row (batch index, the one run of cells it sees); None: batched


def _row_runs(rows: slice | torch.Tensor, n_rows: int, cells: slice | torch.Tensor, block: torch.Tensor):
    """(row, cell run) per row if every row sees one contiguous run of cells, else None."""
    row_ids = list(range(n_rows))[rows] if isinstance(rows, slice) else rows.tolist()
    seen = block[0, 0] == 0  # [T_s, C_s]
    runs = []
    for j, row in enumerate(row_ids):
        idx = torch.nonzero(seen[j]).flatten()
        idx = idx + cells.start if isinstance(cells, slice) else cells[idx]
        run = _as_slice(idx)
        if not isinstance(run, slice):
            return None
        runs.append((row, run))
    return runs


def cell_groups(mask: torch.Tensor, seq: torch.Tensor, visible_cells: torch.Tensor) -> list[SeqGroup]:
    """Per sequence of the batch: its rows, the cells it may see, their mask block, and the per-row runs.

    mask: [1, 1, T, n_live] the full additive mask; seq: [T] sequence id per row; visible_cells: [n_live, n_seq]
    bool, cell holds that sequence. row_cells lets each row attend alone over exactly the cells it sees."""
    groups = []
    unique = seq.unique(sorted=False).tolist()
    for s in unique:
        rows = _as_slice(torch.nonzero(seq == s).flatten()) if len(unique) > 1 else slice(None)
        cells = _as_slice(torch.nonzero(visible_cells[:, s]).flatten())
        block = mask[:, :, rows] if isinstance(rows, slice) else mask[:, :, rows.to(mask.device)]
        block = block[..., cells] if isinstance(cells, slice) else block[..., cells.to(mask.device)]
        row_cells = _row_runs(rows, len(seq), cells, block.cpu())
        if not isinstance(cells, slice):
            cells = cells.to(mask.device)
        if not isinstance(rows, slice):
            rows = rows.to(mask.device)
        groups.append(SeqGroup(rows, cells, block, row_cells))
    return groups
