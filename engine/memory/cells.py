"""Unified KV cache of cells, llama.cpp style, plugged into transformers as a `Cache`.

Every layer owns K/V buffers of `n_cells` slots. Each cell has a position and a set of sequence ids (a bool row),
so one cell can serve several sequences (a shared prefix is stored once). A forward writes its rows into cells
chosen by `prepare()`, attends over the live range `[0, n_live)` and is told who sees what by a 4D additive
mask: row t sees cell c iff c holds t's sequence at a position <= t's position. Rejecting a draft is
`seq_rm(seq, p0, -1)`: the accepted K/V stay where they are, nothing is copied.

K/V live on each layer's device (a model split by accelerate's device map puts its layers on several); the
bookkeeping (which cell holds which position of which sequence) lives on the CPU, where numpy reads it in place.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import Cache

from engine.batch import Batch
from engine.memory.layer_kinds import FULL, SLIDING, LayerKinds


class CellCache(Cache):
    def __init__(
        self,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        n_cells: int,
        n_seq_max: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        sliding_window: int | None = None,
        by_seq: bool = False,
        kinds: LayerKinds | None = None,
        layer_devices: list | None = None,
    ):
        """kinds: each layer's attention kind and each kind's window (engine/memory/layer_kinds.py); without it
        every layer sees the same cells, within `sliding_window` if one is given. layer_devices: each layer's
        device (a device map's); None: every layer on `device`."""
        super().__init__(layers=[])
        self.n_cells = n_cells  # capacity in tokens, summed over all sequences
        self.n_seq_max = n_seq_max  # sequence ids are 0 .. n_seq_max - 1
        self.dtype = dtype
        self.device = torch.device(device)
        if kinds is None:
            kind = FULL if sliding_window is None else SLIDING
            kinds = LayerKinds(types=(kind,) * n_layers, windows={kind: sliding_window})
        # per kind, a row sees only cells less than its window of positions behind it (None: its whole past)
        self.kinds = kinds
        # place position p of sequence s at cell s * (n_cells // n_seq_max) + p when free, so each sequence's
        # cells form one run that per-sequence attention reads as a slice; any free cell otherwise
        self.by_seq = by_seq
        shape = (1, n_kv_heads, n_cells, head_dim)
        if layer_devices is not None and len(layer_devices) != n_layers:
            raise ValueError(f"layer_devices: {len(layer_devices)} devices for {n_layers} layers")
        self.layer_devices = [torch.device(d) for d in layer_devices] if layer_devices else [self.device] * n_layers
        self.k = [torch.zeros(shape, dtype=dtype, device=d) for d in self.layer_devices]
        self.v = [torch.zeros(shape, dtype=dtype, device=d) for d in self.layer_devices]
        self.cell_pos = torch.full((n_cells,), -1, dtype=torch.long, device="cpu")  # -1: empty cell
        # [cell, seq]: cell belongs to seq
        self.cell_seq = torch.zeros((n_cells, n_seq_max), dtype=torch.bool, device="cpu")
        self.n_live = 0  # cells [0, n_live) cover every used cell; attention reads only those
        # cells the current forward writes, in batch row order: a slice, or their indices on each layer's device
        self._write: dict[torch.device, torch.Tensor] | slice | None = None
        self.last_cells = torch.empty(0, dtype=torch.long, device="cpu")  # the same on the CPU, kept after it

    @property
    def sliding_window(self) -> int | None:
        """The one window of every layer. Raises ValueError where layers see different cells, which one
        mask or one layout cannot describe (`prepare` then gives one mask per kind)."""
        if not self.kinds.uniform:
            raise ValueError(f"layers of several windows ({self.kinds.windows}): no single window")
        return self.kinds.windows[self.kinds.types[0]]

    # ---- bookkeeping ---------------------------------------------------------------------------------------

    can_share = True  # cells can hold several sequences: a common prefix is stored once (seq_cp)

    def n_used(self) -> int:
        return int((self.cell_pos >= 0).sum())

    def _refresh_live(self) -> None:
        # cells past n_live are free, so only [0, n_live) can hold the last used one
        used = np.flatnonzero(self.cell_pos[: self.n_live].numpy() >= 0)
        self.n_live = int(used[-1]) + 1 if len(used) else 0

    def _check_seq(self, seq: int) -> None:
        if not (-1 <= seq < self.n_seq_max):
            raise ValueError(f"sequence id {seq} out of range [0, {self.n_seq_max})")

    def _select(self, seq: int, p0: int, p1: int) -> torch.Tensor:
        """Bool [n_cells]: cells of `seq` (any if -1) with p0 <= pos < p1 (-1 = unbounded)."""
        sel = self.cell_pos >= 0
        if seq >= 0:
            sel &= self.cell_seq[:, seq]
        if p0 >= 0:
            sel &= self.cell_pos >= p0
        if p1 >= 0:
            sel &= self.cell_pos < p1
        return sel

    def clear(self) -> None:
        self.cell_pos.fill_(-1)
        self.cell_seq.zero_()
        self.n_live = 0

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove positions [p0, p1) of `seq` (-1 = all sequences / unbounded). Always possible for cells."""
        self._check_seq(seq)
        sel = self._select(seq, p0, p1)
        if seq >= 0:
            self.cell_seq[sel, seq] = False
        else:
            self.cell_seq[sel] = False
        freed = sel & ~self.cell_seq.any(dim=1)
        self.cell_pos[freed] = -1
        self._refresh_live()
        return True

    def rm_cells(self, cells: torch.Tensor) -> None:
        """Free these cells whatever they hold: the branches of a draft tree the target did not take, which share
        positions with the path it took and so cannot be named by a position range."""
        self.cell_seq.numpy()[cells.numpy()] = False
        self.cell_pos.numpy()[cells.numpy()] = -1
        self._refresh_live()

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Let `dst` share the cells of `src` in [p0, p1): a prefix stored once for both."""
        self._check_seq(src)
        self._check_seq(dst)
        self.cell_seq[self._select(src, p0, p1), dst] = True

    def seq_keep(self, seq: int) -> None:
        """Drop every sequence but `seq`."""
        self._check_seq(seq)
        keep = self.cell_seq[:, seq].clone()
        self.cell_seq.zero_()
        self.cell_seq[:, seq] = keep
        self.cell_pos[~keep] = -1
        self._refresh_live()

    def state_save(self, seq: int):
        """A checkpoint's target part: nothing, since every range of cells can be removed."""
        return None

    def state_restore(self, seq: int, saved, n_tokens: int) -> None:
        """Back to a checkpoint of `n_tokens` tokens: remove everything after them."""
        self.seq_rm(seq, n_tokens, -1)

    def seq_pos_min(self, seq: int) -> int:
        pos = self.cell_pos[self._select(seq, -1, -1)]
        return int(pos.min()) if len(pos) else -1

    def seq_pos_max(self, seq: int) -> int:
        pos = self.cell_pos[self._select(seq, -1, -1)]
        return int(pos.max()) if len(pos) else -1

    def seq_cells(self, seq: int) -> torch.Tensor:
        """Cell indices of `seq`, ordered by position (for views and tests)."""
        idx = torch.nonzero(self._select(seq, -1, -1)).flatten()
        return idx[torch.argsort(self.cell_pos[idx])]

    # ---- one forward -----------------------------------------------------------------------------------------

    def prepare(self, batch: Batch) -> torch.Tensor | dict[str, torch.Tensor]:
        """Claim cells for the batch rows, record them, and return the 4D additive mask [1, 1, T, n_live] (CPU); where
        layers of several kinds see different cells, a dict of them keyed by kind (transformers' models take a
        mask per layer type so), kinds of one window sharing one tensor."""
        cells = self.claim(batch)
        pos = torch.tensor(batch.pos, dtype=torch.long, device="cpu")
        seq = torch.tensor(batch.seq, dtype=torch.long, device="cpu")
        anc = batch.ancestors()
        by_window = {}
        for w in dict.fromkeys(self.kinds.windows.values()):
            mask = self.mask(pos, seq, window=w)
            if anc is not None:
                # tree rows see, among this batch's cells, only their ancestors' and their own; chain rows keep
                # the position rule (their ancestors are exactly the earlier rows of their sequence)
                tree_rows = torch.tensor([p is not None for p in batch.parent], device="cpu")
                block = mask[0, 0][tree_rows]  # [n_tree, n_live]
                block[:, cells] = torch.where(anc[tree_rows], 0.0, torch.finfo(self.dtype).min).to(block)
                mask[0, 0][tree_rows] = block
            by_window[w] = mask
        if len(by_window) == 1:
            return next(iter(by_window.values()))
        return {kind: by_window[w] for kind, w in self.kinds.windows.items()}

    def claim(self, batch: Batch) -> torch.Tensor:
        """Claim and record a cell for every batch row (in row order, returned); what `prepare` does without the
        mask, for a forward that reads which cells a row sees from the batch (attention.batch_layout). numpy on
        views of the cell arrays: a torch indexing step costs several times numpy's."""
        n = len(batch)
        if min(batch.seq) < 0 or max(batch.seq) >= self.n_seq_max:
            raise ValueError(f"sequence id out of range [0, {self.n_seq_max})")
        pos, seq = np.asarray(batch.pos, dtype=np.int64), np.asarray(batch.seq, dtype=np.int64)
        cell_pos, cell_seq = self.cell_pos.numpy(), self.cell_seq.numpy()
        cells = self._preferred(pos, seq) if self.by_seq else None  # free by construction
        if cells is None:
            free = np.flatnonzero(cell_pos < 0)
            if len(free) < n:
                raise RuntimeError(f"KV cache full: {n} new tokens, {len(free)} of {self.n_cells} cells free")
            cells = free[:n]
        self._check_new(batch)
        cell_pos[cells] = pos
        cell_seq[cells] = False
        cell_seq[cells, seq] = True
        self.n_live = max(self.n_live, int(cells.max()) + 1)
        first = int(cells[0])
        contiguous = bool((np.diff(cells) == 1).all())
        cells = torch.from_numpy(cells)
        self._write = slice(first, first + n) if contiguous else {d: cells.to(d) for d in set(self.layer_devices)}
        self.last_cells = cells.clone()
        return cells

    def _check_new(self, batch: Batch) -> None:
        """One cell per (seq, pos): a position of a sequence must not be written twice, neither over a cell it
        holds (cells past n_live are free) nor twice in the batch, except a tree's siblings, which share one.
        Only cells at or past the batch's first position can hold one of its rows: a batch that appends looks
        at the other sequences' last few cells, not at every live cell, which grows with the context."""
        cell_pos = self.cell_pos[: self.n_live].numpy()
        hits = np.flatnonzero(cell_pos >= min(batch.pos))
        held: set[tuple[int, int]] = set()
        if len(hits):
            at, seqs = np.nonzero(self.cell_seq[: self.n_live].numpy()[hits])
            held = set(zip(seqs.tolist(), cell_pos[hits][at].tolist()))
        siblings = batch.has_tree()
        seen: set[tuple[int, int]] = set()
        for row in zip(batch.seq, batch.pos):
            if row in held or (row in seen and not siblings):
                raise ValueError(f"sequence {row[0]}: a position of this batch is already in the cache")
            seen.add(row)

    def home(self, seq: int | np.ndarray, pos: int | np.ndarray):
        """The cell where position `pos` of `seq` goes when free: its sequence's region start + pos."""
        return seq * (self.n_cells // self.n_seq_max) + pos

    def _preferred(self, pos: np.ndarray, seq: np.ndarray) -> np.ndarray | None:
        """Each row at its home cell, if those cells are all free and in range. A tree's siblings share a home:
        the first row for a position takes it (the first chain merged, usually the likeliest), the others take
        free cells elsewhere, and `settle` moves a kept node home after verification."""
        cells = self.home(seq, pos)
        cell_pos = self.cell_pos.numpy()
        if int(cells.max()) >= self.n_cells or not bool((cell_pos[cells] < 0).all()):
            return None
        _, first_at = np.unique(cells, return_index=True)
        if len(first_at) == len(cells):  # no siblings: every row has its home cell
            return cells
        first = np.zeros(len(cells), dtype=bool)
        first[first_at] = True
        spare = cell_pos < 0
        spare[cells] = False
        others = np.flatnonzero(spare)[: int((~first).sum())]
        if len(others) < int((~first).sum()):
            return None
        cells = cells.copy()
        cells[~first] = others
        return cells

    def settle(self, cells: list[int]) -> None:
        """Move each of these cells (a kept tree path) to its home cell when that is free, so the sequence stays
        one run of cells (read as a slice, with no gather)."""
        src, dst = [], []
        cell_pos, cell_seq = self.cell_pos.numpy(), self.cell_seq.numpy()  # views: numpy's scalar steps are cheap
        for c in cells:
            pos = int(cell_pos[c])
            seqs = np.flatnonzero(cell_seq[c])
            if pos < 0 or len(seqs) != 1:
                continue
            home = int(self.home(int(seqs[0]), pos))
            if home == c or home >= self.n_cells or int(cell_pos[home]) >= 0:
                continue
            cell_pos[home], cell_seq[home] = pos, cell_seq[c]
            cell_pos[c], cell_seq[c] = -1, False
            self.n_live = max(self.n_live, home + 1)  # a branch freed above it may have lowered n_live
            src.append(c)
            dst.append(home)
        if src:  # every destination was free and no source is one: one copy per layer moves them all
            moves = {d: (torch.tensor(src, device=d), torch.tensor(dst, device=d)) for d in set(self.layer_devices)}
            for k, v, d in zip(self.k, self.v, self.layer_devices):
                src_t, dst_t = moves[d]
                k[:, :, dst_t] = k[:, :, src_t]
                v[:, :, dst_t] = v[:, :, src_t]
        self._refresh_live()

    def mask(self, pos: torch.Tensor, seq: torch.Tensor, window: int | None | str = "uniform") -> torch.Tensor:
        """Additive mask [1, 1, T, n_live] for rows at `pos` of sequences `seq` over the live cells, within
        `window` positions ("uniform": the one window of every layer), on the CPU, where the forward reads each
        row's cells from it (the model gets its own copy)."""
        if window == "uniform":
            window = self.sliding_window
        cell_pos = self.cell_pos[: self.n_live].numpy()
        pos_np = pos.numpy()
        visible = self.cell_seq[: self.n_live].numpy()[:, seq.numpy()].T  # [T, n_live]
        visible &= cell_pos[None, :] <= pos_np[:, None]
        visible &= cell_pos[None, :] >= 0
        if window is not None:
            visible &= pos_np[:, None] - cell_pos[None, :] < window
        out = torch.zeros(visible.shape, dtype=self.dtype, device="cpu")
        out.masked_fill_(torch.from_numpy(~visible), torch.finfo(self.dtype).min)
        return out[None, None]

    def rollback_claim(self) -> None:
        """Undo prepare() when a forward fails, so the cache holds only what it held before."""
        if self._write is None:
            return
        cells = (torch.arange(self._write.start, self._write.stop, device="cpu") if isinstance(self._write, slice)
                 else self.last_cells)
        self.cell_pos[cells] = -1
        self.cell_seq[cells] = False
        self._write = None
        self._refresh_live()

    # ---- transformers Cache interface ----------------------------------------------------------------------

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # key_states: [1, n_kv_heads, T, head_dim] for the batch rows, in row order
        k, v = self.k[layer_idx], self.v[layer_idx]
        if isinstance(self._write, slice):
            k[:, :, self._write] = key_states
            v[:, :, self._write] = value_states
        else:
            where = self._write[self.layer_devices[layer_idx]]
            k.index_copy_(2, where, key_states)
            v.index_copy_(2, where, value_states)
        return k[:, :, : self.n_live], v[:, :, : self.n_live]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.cell_pos.max()) + 1

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.n_live, 0

    @property
    def is_compileable(self) -> bool:
        return False
