"""The lean forward's decoder layers in one C call (engine/forward/kernels/lean_layers.c), where everything is float32.

Between its linears the lean forward makes about 40 small torch calls a layer (norms, rotary embedding, cache
writes, reshapes); at a few rows each costs its dispatch, and on the embedded model they added up to a large
share of a one-row forward. The C loop does the same layers with the same linear and attention kernels, in
every layout of engine/forward/layer_spec.py (pre-norm, Gemma's sandwich, OLMo 2's post-norm), with q and k norms
per head or whole, SiLU or GELU, layers without rotary, and a rotary table and a row layout per attention kind. It
applies when the model is float32, every layer linear is our float32 kernel (engine/forward/gemm.py; its weights
as float32 or as a GGUF's blocks, engine/forward/quant.py) with no bias but on q, k and v (Qwen2), Phi-3's fused
q, k, v and gate, up linears split on the kernel's blocks, each head rotated whole, no layer soft-capping its
scores (Gemma 2), every norm of one epsilon, and the context attending with the C kernel; anything else runs the
torch layers of engine/forward/lean.py.
"""

from __future__ import annotations

import ctypes

import torch

from engine.forward.attention import CellRows, LayerRows
from engine.forward.gemm import SmallGemm
from engine.forward.kernels import registry

_NAMES = ("q", "k", "v", "o", "gate", "up", "down")
# how lean_layers.c reads a weight: float32, GGUF blocks as float32, or GGUF blocks by integer dot products
_KINDS = {"": 0, "q4_1": 1, "q8_0": 2, "q4_1_dot": 3, "q8_0_dot": 4, "q4_0_dot": 5, "q5_0_dot": 6, "q6_k_dot": 7}
GELU, QK_WHOLE = 1, 2  # lean_layers.c's flags
_NORMS = ("norm_in", "norm_attn_out", "norm_mlp", "norm_mlp_out")  # a layer's four places, None where it has none
MAX_LAYOUTS = 4  # row layouts (distinct windows) one call takes


def _pointers(tensors) -> ctypes.Array:
    """C pointers to the tensors' data, NULL for None."""
    return (ctypes.c_void_p * len(tensors))(*[None if t is None else t.data_ptr() for t in tensors])


def _ints(values) -> ctypes.Array:
    return (ctypes.c_int * len(values))(*values)


def _linears(layer) -> list[tuple] | None:
    """The layer's seven (weight, bias) in _NAMES order, Phi-3's fused q, k, v and gate, up taken apart by their
    outputs (gemm.SmallGemm.outputs); None where a fused one is not our kernel or does not split on blocks."""
    if layer.qkv is None and layer.gate_up is None:
        return [getattr(layer, name) for name in _NAMES]
    qkv, gate_up = layer.qkv[0], layer.gate_up[0]
    if not (isinstance(qkv, SmallGemm) and isinstance(gate_up, SmallGemm)) or layer.qkv[1] is not None \
            or layer.gate_up[1] is not None:
        return None
    nq, nkv, ff = layer.n_heads * layer.head_dim, layer.n_kv_heads * layer.head_dim, gate_up.n // 2
    q, k, v = qkv.outputs(0, nq), qkv.outputs(nq, nq + nkv), qkv.outputs(nq + nkv, nq + 2 * nkv)
    gate, up = gate_up.outputs(0, ff), gate_up.outputs(ff, 2 * ff)
    if None in (q, k, v, gate, up):
        return None
    return [(q, None), (k, None), (v, None), layer.o, (gate, None), (up, None), layer.down]


def _shape(layer, linears: list[tuple]) -> tuple:
    """What one C call assumes every layer shares: activation, q and k norms, sizes and scaling."""
    return (layer.act, layer.q_norm is None, layer.qk_norm_per_head, layer.head_dim, layer.scaling,
            tuple(w.n for w, _ in linears))


class FusedLayers:
    """The layers of one LeanForward as one C call; `build` returns None (and why) where it does not apply."""

    def __init__(self, fn, lean, linears: list[list[tuple]]):
        """linears: [layer][j] (weight, bias), j in _NAMES order (`_linears`)."""
        self.fn = fn
        self.n_layers = lean.n_layers
        first = lean.layers[0]
        self.head_dim = first.head_dim
        self.n_heads = linears[0][0][0].n // self.head_dim
        self.n_kv_heads = linears[0][1][0].n // self.head_dim
        self.mlp = linears[0][4][0].n
        self.d = linears[0][0][0].k  # the residual stream's width
        self.scaling = first.scaling
        self.eps = lean.spec.final_norm.eps  # every norm's (build checks)
        self.flags = (GELU if first.act != "silu" else 0) | (0 if first.qk_norm_per_head else QK_WHOLE)
        self._weights = [w.weight for layer in linears for w, _ in layer]
        self._norms = [None if getattr(layer, n) is None else getattr(layer, n).weight.float().contiguous()
                       for layer in lean.layers for n in _NORMS]
        self.weights, self.norms = _pointers(self._weights), _pointers(self._norms)
        self._head_norms = [n.weight.float().contiguous() for layer in lean.layers for n in (layer.q_norm, layer.k_norm)
                            if n is not None]
        self.head_norms = _pointers(self._head_norms) if self._head_norms else None
        self._biases = [b.float().contiguous() for layer in linears for _, b in layer[:3]
                        if b is not None]  # kept: the C call reads them through pointers
        self.biases = _pointers(self._biases) if self._biases else None
        self.kinds = _ints([_KINDS[w.kind] for layer in linears for w, _ in layer])
        self.rot_kinds = lean.kinds  # the rotary tables' order
        self.rot_of = _ints([lean.kinds.index(layer.kind) if layer.rope else -1 for layer in lean.layers])
        self._cache_key = None
        self.kc = self.vc = None
        self._keep: dict[tuple[int, ...], ctypes.Array] = {}  # inner layers -> the C call's column per layer

    @classmethod
    def build(cls, lean) -> tuple["FusedLayers | None", str]:
        if lean.dtype != torch.float32:
            return None, f"{lean.dtype} weights (the fused layers are float32)"
        first = lean.layers[0]
        width = lean.rotary_width()
        if width is not None and width != first.head_dim:
            return None, f"a rotary table of {width} over heads of {first.head_dim} (partial rotary: torch layers)"
        linears = [_linears(layer) for layer in lean.layers]
        if None in linears:
            return None, "q, k, v or gate, up in one linear that does not split on our kernel's blocks"
        first_linears = linears[0]
        for layer, packed in zip(lean.layers, linears):
            if not all(isinstance(w, SmallGemm) and w.dtype == torch.float32 and w.kind in _KINDS for w, _ in packed):
                return None, "a layer linear is not our float32 kernel"
            biased = [bias is not None for _, bias in packed]
            if biased not in ([False] * 7, [True] * 3 + [False] * 4) or \
                    biased[:3] != [b is not None for _, b in first_linears[:3]]:
                return None, "biases other than on every layer's q, k and v"
            if layer.softcap is not None:
                return None, "soft-capped attention scores (Gemma 2): the C attention does not cap"
            if layer.head_dim % 2 or layer.head_dim > 512 or _shape(layer, packed) != _shape(first, first_linears):
                return None, "a head size the fused layers do not take, or layers of different shapes"
            norms = [layer.norm_in, layer.norm_attn_out, layer.norm_mlp, layer.norm_mlp_out, layer.q_norm,
                     layer.k_norm]
            if any(n is not None and n.eps != lean.spec.final_norm.eps for n in norms):
                return None, "norms of several epsilons"
        lib, where = registry.load("lean_layers")
        if lib is None:
            return None, where
        return cls(lib.lean_layers, lean, linears), registry.LIBRARIES["lean_layers"].runs

    @staticmethod
    def _layouts(cell_rows) -> list[CellRows]:
        """The forward's distinct row layouts (kinds of one window share one)."""
        if isinstance(cell_rows, LayerRows):
            return list({id(r): r for r in cell_rows.by_kind.values()}.values())
        return [cell_rows]

    def applies(self, cache, cell_rows) -> bool:
        """The context attends with the C kernel over a float32 cache laid out [1, H_kv, n_cells, hd]."""
        k0 = cache.k[0]
        layouts = self._layouts(cell_rows)
        return (len(layouts) <= MAX_LAYOUTS
                and all(isinstance(r, CellRows) and r.impl.kernel is not None for r in layouts)
                and k0.dtype == torch.float32 and k0.is_contiguous()
                and k0.shape[1] == self.n_kv_heads and k0.shape[3] == self.head_dim)

    def __call__(self, x: torch.Tensor, rotary: dict, cache, cell_rows,
                 inner: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [t, D] float32, changed in place; rotary {kind: (cos, sin) [t, hd]} -> (x after the last layer,
        [t, len(inner) * D]: x after each layer of `inner` side by side, or None when inner is empty)."""
        key = (cache.k[0].data_ptr(), cache.k[0].shape[2])
        if key != self._cache_key:
            self.kc, self.vc, self._cache_key = _pointers(cache.k), _pointers(cache.v), key
        t, d = x.shape
        cells = cache.last_cells.contiguous()
        n_cells = cache.k[0].shape[2]
        cos = [rotary[kind][0].contiguous() for kind in self.rot_kinds]
        sin = [rotary[kind][1].contiguous() for kind in self.rot_kinds]
        if d != self.d or any(c.shape != (t, self.head_dim) for c in cos + sin) or cells.numel() != t \
                or not x.is_contiguous() or x.dtype != torch.float32:
            raise ValueError(f"fused layers: rows {tuple(x.shape)} with rotary {tuple(cos[0].shape)} into "
                             f"{cells.numel()} cells")
        layouts = self._layouts(cell_rows)
        for rows in layouts:
            rows.layout.check(t, n_cells)
        if t == 0:
            return x, (torch.empty(0, len(inner) * d, device="cpu") if inner else None)
        if cells.dtype != torch.int64 or int(cells.min()) < 0 or int(cells.max()) >= n_cells:
            raise ValueError(f"fused layers: a row written outside the cache's {n_cells} cells")
        if isinstance(cell_rows, LayerRows):
            index = {id(r): i for i, r in enumerate(layouts)}
            rows_of = _ints([index[id(cell_rows.by_kind[kind])] for kind in cell_rows.types])
        else:
            rows_of = _ints([0] * self.n_layers)
        hidden = torch.empty(t, len(inner) * d, device="cpu") if inner else None
        keep = self._keep.get(tuple(inner))
        if keep is None:  # made once per set of layers: a drafter asks for the same ones every forward
            keep = self._keep[tuple(inner)] = _ints(
                [inner.index(i + 1) if i + 1 in inner else -1 for i in range(self.n_layers)])
        failed = self.fn(x.data_ptr(), t, d, self.n_layers, self.weights, self.kinds, self.norms, self.head_norms,
                         self.biases, self.flags, self.kc, self.vc, n_cells, cells.data_ptr(), _pointers(cos),
                         _pointers(sin), self.rot_of, _pointers([r.layout.row_ptr for r in layouts]),
                         _pointers([r.layout.cells for r in layouts]), rows_of, len(layouts), self.n_heads,
                         self.n_kv_heads, self.head_dim, self.mlp, self.scaling, self.eps, keep,
                         None if hidden is None else hidden.data_ptr(), len(inner))
        if failed:
            raise MemoryError("fused layers: no memory for the scratch rows")
        return x, hidden
