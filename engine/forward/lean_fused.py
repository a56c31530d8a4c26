"""The lean forward's decoder layers in one C call (engine/forward/kernels/lean_layers.c), where everything is float32.

Between its linears the lean forward makes about 40 small torch calls a layer (norms, rotary embedding, cache
writes, reshapes); at a few rows each costs its dispatch, and on the embedded model they added up to a large
share of a one-row forward. The C loop does the same layers with the same linear and attention kernels. It
applies when the model is float32, every layer linear is our float32 kernel without a bias
(engine/forward/gemm.py; its weights as float32 or as a GGUF's Q4_1 / Q4_0 / Q5_0 / Q8_0 blocks, engine/forward/quant.py), the
model has no per-head norms (Qwen3 keeps the torch path), and the context attends with the C kernel; anything
else runs the torch layers of engine/forward/lean.py.
"""

from __future__ import annotations

import ctypes

import torch

from engine.forward.gemm import SmallGemm
from engine.forward.kernels import registry

_NAMES = ("q", "k", "v", "o", "gate", "up", "down")
# how lean_layers.c reads a weight: float32, GGUF blocks as float32, or GGUF blocks by integer dot products
_KINDS = {"": 0, "q4_1": 1, "q8_0": 2, "q4_1_dot": 3, "q8_0_dot": 4, "q4_0_dot": 5, "q5_0_dot": 6, "q6_k_dot": 7}


def _pointers(tensors) -> ctypes.Array:
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


class FusedLayers:
    """The layers of one LeanForward as one C call; `build` returns None (and why) where it does not apply."""

    def __init__(self, fn, lean):
        self.fn = fn
        self.n_layers = lean.n_layers
        first = lean.layers[0]
        self.head_dim = first.head_dim
        self.n_heads = first.q[0].n // self.head_dim
        self.n_kv_heads = first.k[0].n // self.head_dim
        self.mlp = first.gate[0].n
        self.d = first.q[0].k  # the residual stream's width
        self.scaling = first.scaling
        self.eps = lean.eps
        self._weights = [getattr(layer, name)[0].weight for layer in lean.layers for name in _NAMES]
        self._norms = [n.float().contiguous() for layer in lean.layers for n in (layer.w_in, layer.w_post)]
        self.weights, self.norms = _pointers(self._weights), _pointers(self._norms)
        kinds = [_KINDS[getattr(layer, name)[0].kind] for layer in lean.layers for name in _NAMES]
        self.kinds = (ctypes.c_int * len(kinds))(*kinds)
        self._cache_key = None
        self.kc = self.vc = None
        self._keep: dict[tuple[int, ...], ctypes.Array] = {}  # inner layers -> the C call's column per layer

    @classmethod
    def build(cls, lean) -> tuple["FusedLayers | None", str]:
        if lean.dtype != torch.float32:
            return None, f"{lean.dtype} weights (the fused layers are float32)"
        for layer in lean.layers:
            packed = [getattr(layer, name) for name in _NAMES]
            if not all(isinstance(w, SmallGemm) and w.dtype == torch.float32 and w.kind in _KINDS and bias is None
                       for w, bias in packed):
                return None, "a layer linear is not our float32 kernel without a bias"
            if layer.q_norm is not None or layer.head_dim % 2 or layer.head_dim > 512:
                return None, "per-head norms or a head size the fused layers do not take"
        lib, where = registry.load("lean_layers")
        if lib is None:
            return None, where
        return cls(lib.lean_layers, lean), registry.LIBRARIES["lean_layers"].runs

    def applies(self, cache, cell_rows) -> bool:
        """The context attends with the C kernel over a float32 cache laid out [1, H_kv, n_cells, hd]."""
        k0 = cache.k[0]
        return (cell_rows.impl.kernel is not None and k0.dtype == torch.float32 and k0.is_contiguous()
                and k0.shape[1] == self.n_kv_heads and k0.shape[3] == self.head_dim)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache, cell_rows,
                 inner: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [t, D] float32, changed in place; cos, sin [t, hd] -> (x after the last layer, [t, len(inner) * D]:
        x after each layer of `inner` side by side, or None when inner is empty)."""
        key = (cache.k[0].data_ptr(), cache.k[0].shape[2])
        if key != self._cache_key:
            self.kc, self.vc, self._cache_key = _pointers(cache.k), _pointers(cache.v), key
        t, d = x.shape
        cells = cache.last_cells.contiguous()
        lay = cell_rows.layout
        n_cells = cache.k[0].shape[2]
        if d != self.d or cos.shape != (t, self.head_dim) or sin.shape != cos.shape or cells.numel() != t \
                or not x.is_contiguous() or x.dtype != torch.float32:
            raise ValueError(f"fused layers: rows {tuple(x.shape)} with rotary {tuple(cos.shape)} into "
                             f"{cells.numel()} cells")
        lay.check(t, n_cells)
        if t == 0:
            return x, (torch.empty(0, len(inner) * d, device="cpu") if inner else None)
        if cells.dtype != torch.int64 or int(cells.min()) < 0 or int(cells.max()) >= n_cells:
            raise ValueError(f"fused layers: a row written outside the cache's {n_cells} cells")
        hidden = torch.empty(t, len(inner) * d, device="cpu") if inner else None
        keep = self._keep.get(tuple(inner))
        if keep is None:  # made once per set of layers: a drafter asks for the same ones every forward
            keep = self._keep[tuple(inner)] = (ctypes.c_int * self.n_layers)(
                *[inner.index(i + 1) if i + 1 in inner else -1 for i in range(self.n_layers)])
        failed = self.fn(x.data_ptr(), t, d, self.n_layers, self.weights, self.kinds, self.norms, self.kc, self.vc,
                         cache.k[0].shape[2], cells.data_ptr(), cos.data_ptr(), sin.data_ptr(), lay.row_ptr.data_ptr(),
                         lay.cells.data_ptr(), self.n_heads, self.n_kv_heads, self.head_dim, self.mlp, self.scaling,
                         self.eps, keep, None if hidden is None else hidden.data_ptr(), len(inner))
        if failed:
            raise MemoryError("fused layers: no memory for the scratch rows")
        return x, hidden
