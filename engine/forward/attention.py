"""Attention over the cell cache: every row alone over exactly the cells it sees.

A forward's 4D mask says which cells each row sees (its sequence's cells at positions up to its own, or a draft
tree's committed prefix and the node's ancestors). `cell_layout` turns it once per forward into a compressed
row list: for row r, the cells it sees in position order. Each layer then attends row by row over that list, so
a row never scores another slot's cells, no key is repeated per query head (grouped-query heads share one pass
over their key head), and a row's output does not depend on the batch it ran in.

That last property is what makes speculation lossless to the bit. torch's SDPA and BLAS choose kernels and
blockings by shape: a row scored beside others, or over masked extra cells, comes out a rounding apart, which
bfloat16 linears turn into logits half a unit apart. With the packed linears (engine/forward/prepack.py), also
batch-invariant, a verification forward or a tree of drafts reproduces plain decoding's logits exactly, and a
prompt prefilled at once leaves the cache a prompt prefilled in parts leaves.

Implementations, chosen once per context (`RowAttention`):
- `kernel`: engine/forward/kernels/cell_attention.c, one call per layer for all rows, a fixed order of arithmetic per
  row (float32, CPU; built on first use);
- `torch`: one SDPA call per row over its cells (a slice when they form one run). Any dtype and device; every
  verified row adds a call's fixed cost per layer to the forward, which is what the kernel removes;
- `union` (off the CPU, where per-row calls cost a card its speed): every row in one SDPA call per layer over
  the union of the rows' cells, lossless to the card's rounding (engine/forward/union_attention.py).

The engine passes `cell_rows` (a `CellRows`, or a `LayerRows` where layers of several kinds see different
cells) as a forward kwarg, which transformers hands to the attention function; a forward without it (a plain HF
call on the same model) takes the path the model was configured with (SDPA, or its own eager function). A
layer's logit soft-capping (Gemma 2: cap * tanh(score / cap)) and attention sinks (a learned logit per head that
takes part in the softmax and is then dropped, gpt-oss's `s_aux`) run in the per-row torch path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import sys

import numpy as np
import torch
import torch.nn.functional as F

from engine.forward.kernels import registry
from engine.forward.union_attention import UnionCells, attend_union, union_of

NAME = "spec_cells"  # the attention implementation name registered with transformers (over an SDPA model)
NAME_EAGER = "spec_cells_eager"  # the same over a model configured eager (its own function for plain calls)


@dataclass
class CellLayout:
    """Which cells each row of a forward sees: row r sees cells[row_ptr[r]:row_ptr[r + 1]], in position order."""

    row_ptr: torch.Tensor  # [T + 1] int64, CPU
    cells: torch.Tensor  # [n_seen] int64, CPU

    @property
    def n_rows(self) -> int:
        return self.row_ptr.numel() - 1

    def row(self, r: int) -> torch.Tensor:
        return self.cells[int(self.row_ptr[r]):int(self.row_ptr[r + 1])]

    def check(self, n_rows: int, n_cells: int) -> None:
        """Raises ValueError unless this layout fits `n_rows` query rows over a cache of `n_cells` cells: a C
        kernel reads every index it is given, so a row pointer or a cell out of range must stop here."""
        ptr, cells = self.row_ptr, self.cells
        if ptr.dtype != torch.int64 or cells.dtype != torch.int64 or not ptr.is_contiguous() \
                or not cells.is_contiguous():
            raise ValueError("cell layout: row pointers and cells must be contiguous int64")
        if self.n_rows != n_rows:
            raise ValueError(f"cell layout of {self.n_rows} rows for {n_rows} query rows")
        if int(ptr[0]) != 0 or int(ptr[-1]) != cells.numel() or bool((ptr[1:] < ptr[:-1]).any()):
            raise ValueError("cell layout: row pointers do not run from 0 to the cells' count")
        if cells.numel() and (int(cells.min()) < 0 or int(cells.max()) >= n_cells):
            raise ValueError(f"cell layout: a cell outside the cache's {n_cells}")

    def one_run_per_row(self) -> bool:
        """True if every row's cells are one increasing run of the cache (read as a slice, no gather)."""
        step = self.cells[1:] - self.cells[:-1]
        inside = torch.ones_like(step, dtype=torch.bool)
        ends = self.row_ptr[1:-1] - 1  # the last index of each row but the last
        inside[ends[(ends >= 0) & (ends < step.numel())]] = False
        return bool((step[inside] == 1).all())


def cell_layout(mask: torch.Tensor, cell_pos: torch.Tensor | None = None) -> CellLayout:
    """mask: [1, 1, T, n_live] additive (0 where a row sees a cell); cell_pos: [n_live] position per cell.

    Cells come out in position order within each row, wherever they are stored (a prefix shared with seq_cp,
    a tree's nodes), so the attention's sums run in the order plain decoding runs them."""
    # numpy: a handful of steps over [T, n_live], each of which cost torch tens of microseconds
    seen = (mask[0, 0] == 0).cpu().numpy()  # [T, n_live]
    rows, cells = np.nonzero(seen)  # row-major: cells ascend within a row
    row_ptr = np.zeros(seen.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=seen.shape[0]), out=row_ptr[1:])
    if cell_pos is not None and cells.size > 1:
        pos = cell_pos.cpu().numpy()[cells]
        key = rows * (int(pos.max()) + 1) + pos
        if not bool((key[1:] >= key[:-1]).all()):
            cells = cells[np.argsort(key, kind="stable")]
    return CellLayout(torch.from_numpy(row_ptr), torch.from_numpy(np.ascontiguousarray(cells, dtype=np.int64)))


def batch_layout(cell_pos: torch.Tensor, cell_seq: torch.Tensor, n_live: int, batch, cells: torch.Tensor,
                 window: int | None = None) -> CellLayout:
    """The layout `cell_layout` reads from a forward's mask, read from the batch instead (CellCache.prepare
    builds that mask; CellCache.claim does the rest): a chain row sees its sequence's cells at positions up to
    its own (and within `window`); a tree row sees those its forward did not write, and its ancestors' cells and
    its own. cells: the cell of each batch row. Each row is then one slice of its sequence's cells in position
    order, with no [T, n_live] step: the mask and its reading were a measurable share of a forward of four
    slots (docs/history.md#a-forwards-and-a-rounds-fixed-costs)."""
    pos_all = cell_pos[:n_live].numpy()
    cells_np = cells.numpy()
    written = np.zeros(n_live, dtype=bool)
    written[cells_np] = True
    lineage: list[list[int]] = []  # per row: its ancestors' rows and its own, parents first
    for t, parent in enumerate(batch.parent):
        lineage.append((lineage[parent] if parent is not None else []) + [t])
    own: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
    seq_all = cell_seq[:n_live].numpy()
    for s in dict.fromkeys(batch.seq):
        idx = np.flatnonzero(seq_all[:, s])  # ascending: ties of position stay in cell order, as cell_layout's
        idx = idx[np.argsort(pos_all[idx], kind="stable")]
        idx = idx[pos_all[idx] >= 0]
        kept = ~written[idx]
        own[s] = (idx, pos_all[idx], idx[kept], pos_all[idx[kept]])
    parts, row_ptr = [], np.zeros(len(batch) + 1, dtype=np.int64)
    for t, (s, p, parent) in enumerate(zip(batch.seq, batch.pos, batch.parent)):
        idx, pos, old_idx, old_pos = own[s]
        if parent is not None:
            idx, pos = old_idx, old_pos
        lo = int(np.searchsorted(pos, p - window, side="right")) if window is not None else 0
        row = idx[lo:int(np.searchsorted(pos, p, side="right"))]
        if parent is not None:
            mine = cells_np[lineage[t]]
            row = np.concatenate([row, mine])
            if len(row) > len(mine) and pos_all[mine].min() <= pos_all[row[len(row) - len(mine) - 1]]:
                row = row[np.lexsort((row, pos_all[row]))]
        parts.append(row)
        row_ptr[t + 1] = row_ptr[t] + len(row)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return CellLayout(torch.from_numpy(row_ptr), torch.from_numpy(np.ascontiguousarray(flat, dtype=np.int64)))


class RowAttention:
    """One context's attention: the C kernel where it applies, else torch (the union off the CPU, per row on it)."""

    def __init__(self, device: torch.device, cache_dtype: torch.dtype, use_kernel: bool = True,
                 defines: tuple[str, ...] = (), union: bool | None = None):
        """defines: -D options of the kernel's build (("BLOCK8",): AVX2's 8-wide vectors on an AVX512 CPU);
        union: all rows in one call per layer where the kernel does not run (None: off the CPU)."""
        self.kernel = None
        self.union = torch.device(device).type != "cpu" if union is None else union
        entry = registry.LIBRARIES["cell_attention"]
        fallback = "torch, all rows in one call per layer" if self.union else entry.fallback
        if not use_kernel:
            self.reason = f"{fallback} (kernel turned off)"
        elif torch.device(device).type != "cpu" or cache_dtype != torch.float32:
            self.reason = f"{fallback} (the kernel needs float32 on CPU, not {cache_dtype} on {device})"
        else:
            lib, where = registry.load("cell_attention", defines)
            if lib is None:
                self.reason = f"{fallback} ({where})"
            else:
                self.kernel = lib.cell_attention
                self.reason = entry.runs

    def rows(self, layout: CellLayout) -> "CellRows":
        return CellRows(layout, self)


@dataclass
class CellRows:
    """One forward's layout with the implementation that attends over it; every layer calls `attend`."""

    layout: CellLayout
    impl: RowAttention
    _moved: dict = field(default_factory=dict)  # device -> each row's cells there (cells_on)
    _unions: dict = field(default_factory=dict)  # device -> the rows' union of cells there (union_on)

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
               softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """query [T, H, D]; key, value [1, H_kv, n_live, D] -> [T, H, D]. softcap: scores become
        softcap * tanh(score / softcap); sinks [H]: one extra logit per head in the softmax."""
        if self.impl.kernel is not None and softcap is None and sinks is None:
            return self._kernel(query, key, value, scaling)
        if self.impl.union:
            return attend_union(query, key, value, scaling, self.union_on(key.device), softcap, sinks)
        out = torch.empty_like(query)
        for r, cells in enumerate(self.cells_on(key.device)):
            k, v = _take(key, cells), _take(value, cells)
            if softcap is None and sinks is None:
                out[r] = _one_row(query[r], k, v, scaling)
            else:
                out[r] = _one_row_scored(query[r], k, v, scaling, softcap, sinks)
        return out

    def cells_on(self, device: torch.device) -> list[slice | torch.Tensor]:
        """Each row's cells as a slice or as indices on `device`, moved once per forward and device."""
        found = self._moved.get(device)
        if found is None:
            found = self._moved[device] = [c if isinstance(c, slice) else c.to(device) for c in self.row_cells]
        return found

    def union_on(self, device: torch.device) -> UnionCells:
        found = self._unions.get(device)
        if found is None:
            found = self._unions[device] = union_of(self.layout.row_ptr, self.layout.cells, device)
        return found

    def _kernel(self, query, key, value, scaling) -> torch.Tensor:
        q = query.float().contiguous()
        k, v = _rows_contiguous(key), _rows_contiguous(value)
        if k.stride(1) != v.stride(1):
            k, v = k.contiguous(), v.contiguous()
        t, h, d = q.shape
        out = torch.empty_like(q)
        lay = self.layout
        if k.dim() != 4 or k.shape[0] != 1 or k.shape != v.shape or k.shape[3] != d or h % k.shape[1]:
            raise ValueError(f"cell attention: queries {tuple(q.shape)} over keys {tuple(k.shape)}, values "
                             f"{tuple(v.shape)}")
        lay.check(t, k.shape[2])
        if t == 0:
            return out.to(query.dtype)
        failed = self.impl.kernel(q.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(1), lay.row_ptr.data_ptr(),
                                  lay.cells.data_ptr(), out.data_ptr(), t, h, k.shape[1], d, float(scaling))
        if failed:
            raise MemoryError("cell attention: no memory for the scores")
        return out.to(query.dtype)

    @cached_property
    def row_cells(self) -> list[slice | torch.Tensor]:
        return [_as_slice(self.layout.row(r)) for r in range(self.layout.n_rows)]


@dataclass
class LayerRows:
    """The layouts of one forward where layers of several kinds see different cells: a layer attends over its
    kind's (engine/memory/layer_kinds.py)."""

    by_kind: dict  # kind -> CellRows
    types: tuple[str, ...]  # [n_layers] each layer's kind

    def of(self, module) -> CellRows:
        idx = getattr(module, "layer_idx", None)
        if idx is None:
            raise ValueError(f"{type(module).__name__} has no layer_idx: its attention kind is unknown")
        return self.by_kind[self.types[idx]]


def _rows_contiguous(kv: torch.Tensor) -> torch.Tensor:
    """[1, H_kv, n, D] with unit stride over D and D over cells (a view of the cache usually is)."""
    if kv.dtype != torch.float32:
        kv = kv.float()
    if kv.stride(3) != 1 or kv.stride(2) != kv.shape[3]:
        kv = kv.contiguous()
    return kv


def _take(kv: torch.Tensor, cells: slice | torch.Tensor) -> torch.Tensor:
    return kv[0, :, cells] if isinstance(cells, slice) else kv[0].index_select(1, cells)


def _as_slice(idx: torch.Tensor):
    """A slice if the indices are one increasing run (no copy when indexing), else the index tensor."""
    n = idx.numel()
    if n and int(idx[-1]) - int(idx[0]) + 1 == n and bool((idx[1:] > idx[:-1]).all()):
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return idx


def _one_row(query, key, value, scaling) -> torch.Tensor:
    """One row: query [H, D] over key, value [H_kv, n, D] -> [H, D].

    With grouped-query attention the H / H_kv query heads that share a key head are folded into the query
    length ([H_kv, H / H_kv, D]: head h reads key head h // (H / H_kv), transformers' repeat_kv order), so no
    key or value is repeated or gathered."""
    h, h_kv, d = query.shape[0], key.shape[0], query.shape[-1]
    out = F.scaled_dot_product_attention(query.reshape(h_kv, h // h_kv, d), key.to(query.dtype),
                                         value.to(query.dtype), scale=scaling)
    return out.reshape(h, d)


def _one_row_scored(query, key, value, scaling, softcap, sinks) -> torch.Tensor:
    """`_one_row` with soft-capped scores and/or sink logits, in float32: query [H, D]; key, value [H_kv, n, D]."""
    h, h_kv, d = query.shape[0], key.shape[0], query.shape[-1]
    q = query.float().reshape(h_kv, h // h_kv, d)
    scores = (q @ key.float().transpose(1, 2)) * scaling  # [H_kv, H / H_kv, n]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if sinks is not None:
        sink = sinks.float().reshape(h_kv, h // h_kv, 1)
        both = torch.cat([scores, sink], dim=-1)
        probs = torch.softmax(both - both.amax(-1, keepdim=True), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return (probs @ value.float()).reshape(h, d).to(query.dtype)


def _plain_call(module, query, key, value, attention_mask, dropout, scaling, eager: bool, **kwargs):
    """A forward without the engine's rows: the path the model was configured with."""
    if eager:  # the model's own eager function (softcap, sinks and all), from its modeling module
        fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if fn is None:
            raise ValueError(f"{type(module).__module__} has no eager_attention_forward")
        return fn(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def _attention(module, query, key, value, attention_mask, dropout, scaling, eager: bool, **kwargs):
    """query [1, H, T, D]; key, value [1, H_kv, n_live, D] -> ([1, T, H, D], None), like sdpa_attention_forward."""
    rows = kwargs.pop("cell_rows", None)
    if rows is None:
        return _plain_call(module, query, key, value, attention_mask, dropout, scaling, eager, **kwargs)
    if isinstance(rows, LayerRows):
        rows = rows.of(module)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = rows.attend(query[0].transpose(0, 1), key, value, scale, softcap=kwargs.get("softcap"),
                      sinks=kwargs.get("s_aux"))
    return out[None], None


def cell_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    return _attention(module, query, key, value, attention_mask, dropout, scaling, False, **kwargs)


def cell_attention_eager(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                         **kwargs):
    return _attention(module, query, key, value, attention_mask, dropout, scaling, True, **kwargs)


def use_cell_attention(model) -> bool:
    """Switch a model to cell attention if it runs attention through transformers' interface; True if it did."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    current = getattr(model.config, "_attn_implementation", None)
    if current in (NAME, NAME_EAGER):
        return True  # another context on the same model switched it already
    if current not in ("sdpa", "eager"):
        return False  # flash or a custom kernel: leave the model as it was configured
    name, fn = (NAME, cell_attention) if current == "sdpa" else (NAME_EAGER, cell_attention_eager)
    AttentionInterface.register(name, fn)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[current])
    model.set_attn_implementation(name)
    # a model whose attention does not go through transformers' interface (Falcon) keeps its own: it then reads
    # the forward's 4D mask
    return model.config._attn_implementation == name
