"""GGUFs of random weights in the shapes of real models, for measuring at a real model's size without its file.

A file holds a real model's dimensions (hidden size, layers, heads, KV heads, FFN width, rotary base, tied head or
not) with the embedded model's vocabulary and tokenizer copied from its GGUF (49k tokens, not the real model's),
weights drawn N(0, 0.02) and quantised tensor by tensor as llama.cpp's quantize tool would store them:

- Q8_0: every matrix Q8_0.
- Q4_0: every matrix Q4_0, the output head (or the embedding it is tied to) Q6_K.
- Q4_K_M: Q4_K, with Q6_K for the output head (or the tied embedding), and for `attn_v` and `ffn_down` in the
  layers `use_more_bits` picks: the first and last eighth and every third between (llama.cpp's
  `llama_tensor_get_type` in src/llama-quant.cpp). A row not a multiple of 256 falls back as there: Q4_K to
  Q5_0, Q6_K to Q8_0.

Q4_0 and Q8_0 blocks come from gguf-py's quantisers, Q4_K and Q6_K from engine/load/kquants.py. Files are written
into `<cache>/random-gguf`, named by model, type, layers and seed (`random_gguf_path`), streamed a tensor at a time
(an 8B model never sits in memory whole), under a temporary name renamed when complete.
"""

from __future__ import annotations

import functools
import os
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from engine.load.disk_cache import building
from engine.load.gguf import cache_dir, embedded_gguf_path

FORMAT = 1  # bumped when what a file holds changes, so cached files of an older layout are not reused
STD = 0.02
_CHUNK = 1 << 22  # weights drawn and quantised at a time


@dataclass(frozen=True)
class Shape:
    arch: str  # GGUF architecture: "llama", "qwen2" (q, k, v biases) or "qwen3" (q and k norms per head)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    rope_theta: float
    tied: bool  # the output head is the embedding table
    rms_eps: float = 1e-5
    context: int = 8192


SHAPES = {
    "llama-3.2-1b": Shape("llama", 2048, 16, 32, 8, 8192, 500000.0, tied=True),
    "qwen2.5-3b": Shape("qwen2", 2048, 36, 16, 2, 11008, 1000000.0, tied=True, rms_eps=1e-6),
    "llama-3.1-8b": Shape("llama", 4096, 32, 32, 8, 14336, 500000.0, tied=False),
}
TYPES = ("Q8_0", "Q4_0", "Q4_K_M")
SMALL_LAYERS = 2  # --small: the model's widths with this many layers
_FILE_TYPE = {"Q8_0": 7, "Q4_0": 2, "Q4_K_M": 15}  # llama_ftype: MOSTLY_Q8_0, MOSTLY_Q4_0, MOSTLY_Q4_K_M


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v / ffn_down get more bits in a _M mix."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def tensor_type(name: str, ftype: str, layer: int, n_layers: int, row: int) -> str:
    """The GGML type a matrix named `name` (llama.cpp's name, "output.weight" for a tied embedding too; row: its
    input width) gets in `ftype`."""
    if ftype == "Q8_0":
        kind = "Q8_0"
    elif name == "output.weight":
        kind = "Q6_K"
    elif ftype == "Q4_0":
        kind = "Q4_0"
    elif ("attn_v" in name or "ffn_down" in name) and use_more_bits(layer, n_layers):
        kind = "Q6_K"
    else:
        kind = "Q4_K"
    if kind.endswith("_K") and row % 256:
        kind = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[kind]
    return kind


def tensors(shape: Shape) -> list[tuple[str, tuple[int, int] | tuple[int], int]]:
    """(llama.cpp name, shape as [rows, inputs] or [n], layer or -1) of every tensor of a model of `shape`."""
    head_dim = shape.hidden // shape.heads
    q, kv = shape.heads * head_dim, shape.kv_heads * head_dim
    out = [("token_embd.weight", (_vocab_size(), shape.hidden), -1)]
    for i in range(shape.layers):
        blk = f"blk.{i}."
        out += [(blk + "attn_norm.weight", (shape.hidden,), i), (blk + "attn_q.weight", (q, shape.hidden), i),
                (blk + "attn_k.weight", (kv, shape.hidden), i), (blk + "attn_v.weight", (kv, shape.hidden), i)]
        if shape.arch == "qwen2":
            out += [(blk + "attn_q.bias", (q,), i), (blk + "attn_k.bias", (kv,), i), (blk + "attn_v.bias", (kv,), i)]
        if shape.arch == "qwen3":
            out += [(blk + "attn_q_norm.weight", (head_dim,), i), (blk + "attn_k_norm.weight", (head_dim,), i)]
        out += [(blk + "attn_output.weight", (shape.hidden, q), i), (blk + "ffn_norm.weight", (shape.hidden,), i),
                (blk + "ffn_gate.weight", (shape.ffn, shape.hidden), i),
                (blk + "ffn_up.weight", (shape.ffn, shape.hidden), i),
                (blk + "ffn_down.weight", (shape.hidden, shape.ffn), i)]
    out.append(("output_norm.weight", (shape.hidden,), -1))
    if not shape.tied:
        out.append(("output.weight", (_vocab_size(), shape.hidden), -1))
    return out


@functools.lru_cache(maxsize=1)
def _embedded_reader():
    from gguf import GGUFReader

    return GGUFReader(str(embedded_gguf_path()))


def _vocab_size() -> int:
    return len(_embedded_reader().fields["tokenizer.ggml.tokens"].data)


def random_gguf_path(model: str, ftype: str, seed: int = 0, layers: int | None = None,
                     root: Path | None = None) -> Path:
    """Where the file of `model` in `ftype` (with `layers` layers, the model's own by default) is cached."""
    n = SHAPES[model].layers if layers is None else layers
    return (root or cache_dir()) / "random-gguf" / f"{model}-L{n}-s{seed}-f{FORMAT}.{ftype}.gguf"


def random_gguf(model: str, ftype: str, seed: int = 0, layers: int | None = None, root: Path | None = None) -> Path:
    """The cached file of `model` in `ftype`, written now if absent."""
    if ftype not in TYPES:
        raise ValueError(f"type {ftype!r}: one of {', '.join(TYPES)}")
    dst = random_gguf_path(model, ftype, seed, layers, root)
    with building(dst):  # a second process wanting the same file waits for this one's
        if not dst.is_file():
            shape = SHAPES[model] if layers is None else replace(SHAPES[model], layers=layers)
            write(dst, shape, ftype, seed, name=f"random {model}")
    return dst


def write(dst: Path, shape: Shape, ftype: str, seed: int, name: str = "random") -> None:
    """Write a GGUF of `shape` in `ftype` to `dst`, atomically (a half-written file is never read as a model)."""
    from gguf import GGMLQuantizationType, GGUFWriter

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
    plan = [(n, s, layer, _ggml_type(n, s, ftype, shape)) for n, s, layer in tensors(shape)]
    try:
        writer = GGUFWriter(str(tmp), arch=shape.arch)
        _add_metadata(writer, shape, ftype, name)
        for n, s, _, kind in plan:
            qtype = GGMLQuantizationType[kind]
            writer.add_tensor_info(n, _byte_shape(s, qtype), np.dtype(np.uint8 if len(s) == 2 else np.float32),
                                   _nbytes(s, qtype), raw_dtype=qtype if len(s) == 2 else None)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for n, s, _, kind in plan:
            writer.write_tensor_data(_values(n, s, kind, seed))
        writer.close()
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)


def _ggml_type(name: str, s: tuple, ftype: str, shape: Shape) -> str:
    if len(s) == 1:
        return "F32"
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    head = name == "output.weight" or (name == "token_embd.weight" and shape.tied)
    return tensor_type("output.weight" if head else name, ftype, layer, shape.layers, s[1])


def _byte_shape(s: tuple, qtype) -> tuple:
    from gguf import GGML_QUANT_SIZES

    if len(s) == 1:
        return s
    block, size = GGML_QUANT_SIZES[qtype]
    return (s[0], s[1] // block * size)


def _nbytes(s: tuple, qtype) -> int:
    return int(np.prod(_byte_shape(s, qtype))) * (4 if len(s) == 1 else 1)


def _values(name: str, s: tuple, kind: str, seed: int) -> np.ndarray:
    """The tensor's stored data: norms 1, biases and weights N(0, STD), weights in `kind`'s blocks; drawn from a
    generator seeded by the file's seed and the tensor's name, chunk by chunk."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if len(s) == 1:
        return np.ones(s, np.float32) if name.endswith("norm.weight") else \
            rng.normal(0, STD, s).astype(np.float32)
    rows = max(1, _CHUNK // s[1])
    parts = [_quantize(rng.normal(0, STD, (min(rows, s[0] - r), s[1])).astype(np.float32), kind)
             for r in range(0, s[0], rows)]
    return np.concatenate(parts, axis=0)


def _quantize(rows: np.ndarray, kind: str) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from engine.load.kquants import quantize_q4_k, quantize_q6_k

    if kind == "Q4_K":
        return quantize_q4_k(rows)
    if kind == "Q6_K":
        return quantize_q6_k(rows)
    return quantize(rows, GGMLQuantizationType[kind])


def _add_metadata(writer, shape: Shape, ftype: str, name: str) -> None:
    """The model's dimensions under its architecture's keys, and the embedded model's tokenizer fields as they are."""
    from gguf import GGUFValueType

    a = shape.arch
    writer.add_name(name)
    writer.add_uint32(f"{a}.block_count", shape.layers)
    writer.add_uint32(f"{a}.context_length", shape.context)
    writer.add_uint32(f"{a}.embedding_length", shape.hidden)
    writer.add_uint32(f"{a}.feed_forward_length", shape.ffn)
    writer.add_uint32(f"{a}.attention.head_count", shape.heads)
    writer.add_uint32(f"{a}.attention.head_count_kv", shape.kv_heads)
    writer.add_float32(f"{a}.rope.freq_base", shape.rope_theta)
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", shape.rms_eps)
    writer.add_uint32(f"{a}.rope.dimension_count", shape.hidden // shape.heads)
    writer.add_uint32("general.file_type", _FILE_TYPE[ftype])
    writer.add_uint32("general.quantization_version", 2)
    for field in _embedded_reader().fields.values():
        if field.name.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_uint32(f"{a}.vocab_size", _vocab_size())
