"""Float32 rows quantised to GGUF's Q4_K and Q6_K blocks, the two K-quants a Q4_K_M file holds.

gguf-py reads every block type but quantises only the 32-weight ones (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), so the
random-weight writer (engine/load/random_gguf.py) makes these itself. The byte layouts are ggml's `block_q4_K`
and `block_q6_K` (ggml-common.h); the scales are chosen from each sub-block's range in one pass, not by
llama.cpp's search (`make_qkx2_quants`), which only matters for how close a trained weight comes back: what is
written reads back through any GGUF reader as d * scale * q (- dmin * min) exactly.
"""

from __future__ import annotations

import numpy as np

QK_K = 256  # weights per K-quant super-block
Q4_K_BYTES = 2 + 2 + 12 + QK_K // 2  # d, dmin (float16), 8 six-bit scales and mins, 4-bit quants
Q6_K_BYTES = QK_K // 2 + QK_K // 4 + QK_K // 16 + 2  # low 4 bits, high 2 bits, 16 int8 scales, d (float16)


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16)


def _safe_inverse(a: np.ndarray) -> np.ndarray:
    return np.where(a > 0, 1.0 / np.where(a > 0, a, 1.0), 0.0).astype(np.float32)


def _pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """[B, 8] six-bit scales and mins -> [B, 12] bytes as ggml's get_scale_min_k4 reads them: sub-blocks 0..3 in
    the low 6 bits of bytes 0..3 (scales) and 4..7 (mins), sub-blocks 4..7 in the nibbles of bytes 8..11 with
    their top 2 bits in the top bits of bytes 0..7."""
    out = np.empty((ls.shape[0], 12), np.uint8)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0x0F) | ((lm[:, 4:8] & 0x0F) << 4)
    return out


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """[R, K] float32 (K a multiple of 256) -> [R, K / 256 * 144] bytes of Q4_K blocks: each sub-block of 32
    weights w = d * ls * q - dmin * lm, q in 0..15, ls and lm six bits, d and dmin one float16 per block."""
    r, k = rows.shape
    sub = rows.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(sub.min(-1), 0.0)  # a sub-block's offset is a non-negative min taken off
    scale = (sub.max(-1) - lo) / 15.0
    d = _f16(scale.max(-1) / 63.0).astype(np.float32)
    dmin = _f16(-lo.min(-1) / 63.0).astype(np.float32)
    ls = np.clip(np.rint(scale * _safe_inverse(d)[:, None]), 0, 63).astype(np.uint8)
    lm = np.clip(np.rint(-lo * _safe_inverse(dmin)[:, None]), 0, 63).astype(np.uint8)
    step = d[:, None] * ls
    offset = (dmin[:, None] * lm)[..., None]
    q = np.clip(np.rint((sub + offset) * _safe_inverse(step)[..., None]), 0, 15).astype(np.uint8)
    pairs = q.reshape(-1, 4, 2, 32)  # chunk c of 64: sub-block 2c in the low nibbles, 2c + 1 in the high ones
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    head = np.stack([_f16(d), _f16(dmin)], axis=1).view(np.uint8)
    blocks = np.concatenate([head, _pack_scales_k4(ls, lm), qs], axis=1)
    return blocks.reshape(r, k // QK_K * Q4_K_BYTES)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """[R, K] float32 (K a multiple of 256) -> [R, K / 256 * 210] bytes of Q6_K blocks: each sub-block of 16
    weights w = d * sc * (q - 32), q in 0..63, sc an int8, d one float16 per block."""
    r, k = rows.shape
    sub = rows.reshape(-1, 16, 16).astype(np.float32)
    scale = np.abs(sub).max(-1) / 31.0
    d = _f16(scale.max(-1) / 127.0).astype(np.float32)
    sc = np.clip(np.rint(scale * _safe_inverse(d)[:, None]), 0, 127).astype(np.int8)
    step = d[:, None] * sc
    q = (np.clip(np.rint(sub * _safe_inverse(step)[..., None]), -32, 31) + 32).astype(np.uint8)
    # each half of 128 weights: 4 runs of 32 (t), run t's element l in ql[l] / ql[32 + l] and qh[l]'s bits 2t
    runs = q.reshape(-1, 2, 4, 32)
    ql = np.concatenate([(runs[:, :, 0] & 0x0F) | ((runs[:, :, 2] & 0x0F) << 4),
                         (runs[:, :, 1] & 0x0F) | ((runs[:, :, 3] & 0x0F) << 4)], axis=2)
    qh = sum((runs[:, :, t] >> 4) << (2 * t) for t in range(4)).astype(np.uint8)
    blocks = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8),
                             _f16(d)[:, None].view(np.uint8)], axis=1)
    return blocks.reshape(r, k // QK_K * Q6_K_BYTES)
