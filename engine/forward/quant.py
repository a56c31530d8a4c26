"""A GGUF model's linears read from their Q4_1 / Q4_0 / Q5_0 / Q8_0 / Q4_K / Q6_K blocks, not float32 copies.

transformers loads a GGUF by dequantising every weight to float32 (gguf-py's `dequantize`): the embedded model's
linears, stored at 0.625 bytes a weight (Q4_1) and its LM head at 1.06 (Q8_0), become 4 bytes each, and a
one-row forward reads 540 MB. A forward of a few rows costs what reading its weights costs, so here each linear
whose GGUF blocks reproduce its float32 weight exactly keeps the blocks instead (engine/forward/kernels/small_gemm_q.c
widens them block by block as a pass needs them): the same weights, the same sums in the same order, so the
same bits as the float32 kernel, at a seventh of the bytes.

Exactness is checked, not assumed: a linear is taken only if d q + m (Q4_1), d (q - 8) (Q4_0), d (q - 16) (Q5_0)
or d q (Q8_0), computed as gguf-py computes it, equals every element of the loaded weight; llama.cpp's Llama converter stores q and k with rows
permuted for its rotary layout, so those are also compared after transformers' reverse permutation. A GGUF of
another family or quantisation, or a weight that differs, keeps the float32 kernel.

Read as float32, Q4_0 and Q5_0 go through the Q4_1 and Q8_0 kernels (m = -8 d; q - 16 as int8): every product of a
float16 scale and a quant of 5 bits or fewer is exact in float32, so the weights keep their bits. Times 8-bit inputs
each has its own kernel, at its stored size (small_gemm_qdot.c). Q6_K (d * scale * (q - 32) per sub-block of 16, exact
in float32 too: 11 + 8 + 6 bits) runs only times 8-bit inputs, a byte a weight; read as float32 it keeps its copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from engine.forward.gemm import SmallGemm
from engine.forward.kernels import registry

GROUP = 32  # weights per GGUF block along the inputs, both types
MAPPED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")  # the model types whose GGUF tensor names `_targets` maps
# llama.cpp's tensor names -> the Llama-family module names transformers gives them
_LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}


@dataclass
class QuantWeight:
    kind: str  # "q4_1", "q4_0", "q5_0", "q8_0" or "q6_k"
    q: np.ndarray  # [N, K] uint8 as stored (0..15, or 0..31 for q5_0), int8 for q8_0, int8 q - 32 for q6_k
    d: np.ndarray  # [N, K / 32] float32, each block's scale ([N, K / 16] for q6_k: each sub-block's d * scale)
    m: np.ndarray | None  # [N, K / 32] float32, each block's minimum (q4_1)

    @property
    def group(self) -> int:
        return Q6_K_SUB if self.kind == "q6_k" else GROUP

    def dequantize(self) -> np.ndarray:
        """[N, K] float32 as gguf-py computes it: (d * q) + m, or d * (q - offset)."""
        n, k = self.q.shape
        q = self.q.reshape(n, k // self.group, self.group).astype(np.float32) - _OFFSET.get(self.kind, 0)
        w = self.d[:, :, None] * q if self.m is None else (self.d[:, :, None] * q) + self.m[:, :, None]
        return w.reshape(n, k)

    def rows(self, order: np.ndarray) -> "QuantWeight":
        return QuantWeight(self.kind, self.q[order], self.d[order], None if self.m is None else self.m[order])

    def as_float_kernels(self) -> "QuantWeight":
        """The same weights in a type the float32-arithmetic kernels read: Q4_0 as Q4_1, Q5_0 as Q8_0."""
        if self.kind == "q4_0":
            return QuantWeight("q4_1", self.q, self.d, -8 * self.d)
        if self.kind == "q5_0":
            return QuantWeight("q8_0", (self.q.astype(np.int16) - 16).astype(np.int8), self.d, None)
        return self


_OFFSET = {"q4_0": 8, "q5_0": 16}  # what the stored quants carry above the signed ones
# the types read as stored; Q4_K as Q4_1 groups (below)
_GGML_KINDS = {"Q4_1": "q4_1", "Q4_0": "q4_0", "Q5_0": "q5_0", "Q8_0": "q8_0", "Q4_K": "q4_k", "Q6_K": "q6_k"}
QK_K = 256  # weights per K-quant super-block
Q6_K_SUB = 16  # weights per Q6_K sub-block (one int8 scale each)


def _unpack_q6_k(raw: np.ndarray, n: int, k: int) -> QuantWeight:
    """Q6_K blocks [N, K / 256 * 210] (ggml's block_q6_K: ql [128] low nibbles, qh [64] high bit pairs, scales
    [16] int8, d float16) -> q - 32 as int8 and d * scale per sub-block of 16. Within each half of 128: ql[l]
    holds weights l (low nibble) and 64 + l (high), ql[32 + l] weights 32 + l and 96 + l; qh[l] bits 0-1, 2-3,
    4-5, 6-7 are the high pairs of weights l, 32 + l, 64 + l, 96 + l (dequantize_row_q6_K)."""
    blocks = raw.reshape(n, k // QK_K, -1)
    ql = blocks[..., 0:128].reshape(n, -1, 2, 64)
    qh = blocks[..., 128:192].reshape(n, -1, 2, 32)
    scales = blocks[..., 192:208].copy().view(np.int8).astype(np.float32)
    d = blocks[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    lo = np.concatenate([ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=-1)
    hi = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-1)
    q = ((lo | (hi << 4)).astype(np.int16) - 32).astype(np.int8).reshape(n, k)
    return QuantWeight("q6_k", q, (d[..., None] * scales).reshape(n, k // Q6_K_SUB), None)


def _unpack_q4_k(raw: np.ndarray, n: int, k: int) -> QuantWeight:
    """Q4_K blocks [N, K / 256 * 144] -> Q4_1 groups of the same weights: each sub-block of 32 is d * ls * q -
    dmin * lm, so d' = d * ls and m' = -(dmin * lm), exact in float32 (a float16 times six bits), and d' q + m'
    rounds once, as gguf-py's (d * ls) q - dmin * lm does: the same bits. Stored at 24 bytes a group of 32 here
    against Q4_K's 18, a fifth of float32's."""
    blocks = raw.reshape(n, k // QK_K, -1)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sc = blocks[..., 4:16]  # ggml's get_scale_min_k4: sub-blocks 0..3 in six bits, 4..7 split over nibbles
    ls = np.concatenate([sc[..., 0:4] & 63, (sc[..., 8:12] & 0x0F) | ((sc[..., 0:4] >> 6) << 4)], axis=-1)
    lm = np.concatenate([sc[..., 4:8] & 63, (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)], axis=-1)
    qs = blocks[..., 16:].reshape(n, k // QK_K, 4, 1, 32)  # chunk c: sub-block 2c low nibbles, 2c + 1 high
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=3).reshape(n, k)
    scale = (d[..., None] * ls.astype(np.float32)).reshape(n, k // GROUP)
    offset = (dmin[..., None] * lm.astype(np.float32)).reshape(n, k // GROUP)
    return QuantWeight("q4_1", q, scale, -offset)


def _unpack(kind: str, raw: np.ndarray, n: int, k: int) -> QuantWeight:
    """GGUF blocks [N, K / 32 * block bytes] (Q4_K: [N, K / 256 * 144]) -> q, d, m."""
    if kind == "q4_k":
        return _unpack_q4_k(raw, n, k)
    if kind == "q6_k":
        return _unpack_q6_k(raw, n, k)
    blocks = raw.reshape(n, k // GROUP, -1)
    d = blocks[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    if kind == "q4_1":  # d, m (float16), then 16 bytes: element i in byte i's low nibble, i + 16 in its high one
        m = blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)
        qs = blocks[:, :, 4:20]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
        return QuantWeight(kind, q.reshape(n, k), d, m)
    if kind in ("q4_0", "q5_0"):  # d, (q5_0: 32 fifth bits, bit i for element i), then q4_1's 16 bytes
        qs = blocks[:, :, -16:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
        if kind == "q5_0":
            qh = blocks[:, :, 2:6].copy().view(np.uint32)  # [n, g, 1]
            q |= (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)
        return QuantWeight(kind, q.reshape(n, k), d, None)
    q = blocks[:, :, 2:34].copy().view(np.int8)  # q8_0: d (float16), then 32 int8
    return QuantWeight(kind, q.reshape(n, k), d, None)


def by_block(a: np.ndarray, nb: int) -> np.ndarray:
    """[N, G] float32 scales -> [N / nb, G, nb * 4] bytes: each block of nb outputs' scales of one group together."""
    n, g = a.shape
    return np.ascontiguousarray(a.reshape(n // nb, nb, g).transpose(0, 2, 1)).view(np.uint8)


def pack(w: QuantWeight, nb: int) -> torch.Tensor:
    """The kernel's layout (small_gemm_q.c): per block of nb outputs, per group of 32 inputs, d [nb] and m [nb]
    as float32, then the quants output-minor (two 4-bit quants per byte for q4_1: inputs 2p and 2p + 1)."""
    n, k = w.q.shape
    g = k // GROUP

    q = w.q.reshape(n // nb, nb, g, GROUP)
    if w.kind == "q4_1":
        pairs = q.reshape(n // nb, nb, g, GROUP // 2, 2)
        qs = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)  # [blocks, nb, g, 16]
        parts = [by_block(w.d, nb), by_block(w.m, nb), qs.transpose(0, 2, 3, 1).reshape(n // nb, g, -1)]
    else:
        parts = [by_block(w.d, nb), q.view(np.uint8).transpose(0, 2, 3, 1).reshape(n // nb, g, -1)]
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(parts, axis=2)).reshape(-1))


def pack_dot(w: QuantWeight, nb: int) -> torch.Tensor:
    """The integer kernel's layout (small_gemm_qdot.c): per block of nb outputs, per group of 32 inputs, d [nb]
    (and m [nb]) as float32, then the quants in fours, output-major within a vector: q4_1's (q4_0's, q5_0's low
    4 bits, after a vector of their fifth bits) inputs 4p..4p + 3 in the low nibbles and 16 + 4p.. in the high ones
    of vector p; q8_0's plus 128 as unsigned bytes."""
    n, k = w.q.shape
    g = k // GROUP

    q = w.q.reshape(n // nb, nb, g, GROUP)
    if w.kind in ("q4_1", "q4_0", "q5_0"):
        lo, hi = q[..., :16].reshape(n // nb, nb, g, 4, 4), q[..., 16:].reshape(n // nb, nb, g, 4, 4)
        quads = ((lo & 0x0F) | ((hi & 0x0F) << 4)).astype(np.uint8)  # [blocks, nb, g, p, i]
        parts = [by_block(w.d, nb)] + ([by_block(w.m, nb)] if w.kind == "q4_1" else [])
        if w.kind == "q5_0":  # byte 4 j + i: bit 2p the fifth bit of q[4p + i][j], bit 2p + 1 of q[16 + 4p + i][j]
            fifth = sum(((lo[..., p, :] >> 4) << (2 * p)) | ((hi[..., p, :] >> 4) << (2 * p + 1)) for p in range(4))
            parts.append(fifth.astype(np.uint8).transpose(0, 2, 1, 3).reshape(n // nb, g, -1))
        parts.append(quads.transpose(0, 2, 3, 1, 4).reshape(n // nb, g, -1))
    else:  # q8_0, and q6_k with the scales of its two halves of 16 ahead of the bytes
        biased = (q.astype(np.int16) + 128).astype(np.uint8).reshape(n // nb, nb, g, 8, 4)
        scales = [by_block(w.d[:, 0::2], nb), by_block(w.d[:, 1::2], nb)] if w.kind == "q6_k" else [by_block(w.d, nb)]
        parts = scales + [biased.transpose(0, 2, 3, 1, 4).reshape(n // nb, g, -1)]
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(parts, axis=2)).reshape(-1))


def pack_for(w: QuantWeight, nb: int, dot: bool) -> tuple[str, torch.Tensor]:
    """(kernel kind, packed blocks) of `w`: times 8-bit inputs in integers (dot), else read as float32."""
    if dot:
        return w.kind + "_dot", pack_dot(w, nb)
    w = w.as_float_kernels()
    return w.kind, pack(w, nb)


def _llama_reverse_permute(n_rows: int, n_heads: int) -> np.ndarray:
    """The row order transformers' GGUF loader gives q and k (it undoes llama.cpp's rotary permutation):
    row r of the model is row order[r] of the file."""
    half = n_rows // n_heads // 2
    return np.arange(n_rows).reshape(n_heads, half, 2).transpose(0, 2, 1).reshape(-1)


def blocks_read(path: Path, device: str, model_type: str, families: tuple[str, ...] = MAPPED_FAMILIES) -> str:
    """"Q4_1, Q8_0" (of Q4_1, Q4_0, Q5_0, Q8_0, Q4_K, Q6_K; Q6_K times 8-bit inputs only): the quantisations of this
    GGUF's matrices our path on `device` would read as stored; "" where none, where the kernel does not run here, or
    for a family whose names are not mapped (`families`: those the loader maps)."""
    if device != "cpu" or model_type not in families or load_kernels()[2]:
        return ""
    from gguf import GGMLQuantizationType

    from engine.forward.gguf_table import read_table

    found = {t.tensor_type for t in read_table(path) if len(t.shape) == 2}
    return ", ".join(n for n in _GGML_KINDS if GGMLQuantizationType[n] in found)


def _matching(w: QuantWeight, weight: np.ndarray, heads: int) -> QuantWeight | None:
    """w with its rows in the model's order if its blocks give `weight` exactly, else None. q and k may come
    permuted for llama.cpp's rotary layout (Llama's converter does it, Qwen2's does not)."""
    orders = [None] + ([_llama_reverse_permute(weight.shape[0], heads)] if heads else [])
    for order in orders:
        candidate = w if order is None else w.rows(order)
        if np.array_equal(candidate.dequantize(), weight):
            return candidate
    return None


def read_gguf(path: Path) -> dict[str, QuantWeight]:
    """The Q4_1, Q4_0, Q5_0, Q8_0, Q4_K (as Q4_1) and Q6_K tensors of a GGUF by llama.cpp name, unpacked."""
    from gguf import GGMLQuantizationType

    from engine.forward.gguf_table import read_table  # the table alone: gguf-py builds the vocabulary first

    kinds = {int(GGMLQuantizationType[name]): kind for name, kind in _GGML_KINDS.items()}
    out = {}
    for t in read_table(path):
        kind = kinds.get(t.tensor_type)
        if kind is None or len(t.shape) != 2:
            continue
        k, n = (int(s) for s in t.shape)  # GGUF lists the fastest-moving axis first
        if k % (QK_K if kind in ("q4_k", "q6_k") else GROUP) == 0:
            out[t.name] = _unpack(kind, np.asarray(t.data), n, k)
    return out


def _targets(model: nn.Module) -> dict[str, tuple[nn.Linear, int]]:
    """llama.cpp name -> (the linear, its heads for the q/k permutation, else 0), for a Llama-family model."""
    config = model.config
    out = {}
    for i, layer in enumerate(getattr(getattr(model, "model", None), "layers", [])):
        for short, name in _LAYER_NAMES.items():
            module = layer.get_submodule(name)
            heads = {"attn_q": config.num_attention_heads,
                     "attn_k": getattr(config, "num_key_value_heads", None) or config.num_attention_heads}
            out[f"blk.{i}.{short}.weight"] = (module, heads.get(short, 0))
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Linear):
        tied = getattr(head, "weight", None) is model.get_input_embeddings().weight
        out["token_embd.weight" if tied else "output.weight"] = (head, 0)
    return out


def load_kernels(defines: tuple[str, ...] = ()) -> tuple[dict[str, object], int, str]:
    """({kind: multiply}, outputs per block, "") from the built library, or ({}, 0, why not). Kinds "q4_1" and
    "q8_0" read the blocks as float32 (small_gemm_q.c); "q4_1_dot", "q8_0_dot", "q4_0_dot" and "q5_0_dot" (VNNI,
    or AVX2's byte pairs) multiply them by 8-bit inputs in integers (small_gemm_qdot.c). defines: -D options of the build
    (("BLOCK8",): AVX2's 8-wide layout on an AVX512 CPU)."""
    lib, where = registry.load("small_gemm_q", defines)
    if lib is None:
        return {}, 0, where
    dots = ("q4_1_dot", "q8_0_dot", "q4_0_dot", "q5_0_dot", "q6_k_dot")
    kinds = ("q4_1", "q8_0") + (dots if lib.small_gemm_qdot_ok() else ())
    return {kind: getattr(lib, f"small_gemm_{kind}") for kind in kinds}, lib.small_gemm_f32_block(), ""


def attach(model: nn.Module, path: Path, keep_weights: bool = False, dot: bool = False) -> tuple[int, str]:
    """Give each float32 linear of `model` whose GGUF blocks reproduce its weight exactly a packed copy of the
    blocks (before engine/forward/prepack.py packs the others, which it then skips). dot: multiplied by 8-bit inputs in
    integers (llama.cpp's arithmetic), else read as float32 (the float32 weights' bits). (linears taken, why
    not others)."""
    if getattr(model.config, "model_type", "") not in MAPPED_FAMILIES:
        return 0, f"{model.config.model_type}: only the Llama family's GGUF names are mapped"
    fns, nb, why = load_kernels()
    if not fns or (dot and "q4_1_dot" not in fns):
        return 0, why or "the integer kernel does not run on this CPU"
    from engine.forward.prepack import _tied_elsewhere, install, is_packed

    # a model built from its blocks (engine/load/gguf_direct.py) has them packed already
    targets = {name: target for name, target in _targets(model).items() if not is_packed(target[0])}
    if not targets:
        return 0, ""
    stored = read_gguf(path)
    tied = _tied_elsewhere(model)
    taken, differ = 0, []
    with torch.no_grad():
        for name, (module, heads) in targets.items():
            w = stored.get(name)
            if w is not None and w.kind == "q6_k" and not dot:
                continue  # no float32-arithmetic kernel for Q6_K: it keeps its float32 copy
            weight = module.weight
            if w is None or weight.dtype != torch.float32 or weight.shape != w.q.shape or weight.shape[0] % nb:
                continue
            w = _matching(w, weight.detach().numpy(), heads)
            if w is None:
                differ.append(name)
                continue
            n, k = weight.shape
            kind, packed = pack_for(w, nb, dot)
            install(module, SmallGemm(fns[kind], packed, k, n, torch.float32, torch.float32, kind=kind),
                    drop_weight=id(weight) not in tied and not keep_weights)
            taken += 1
    return taken, f"{len(differ)} differ from their blocks ({', '.join(differ[:2])})" if differ else ""
