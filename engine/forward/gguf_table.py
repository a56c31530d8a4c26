"""A GGUF file's tensor table, read without building its metadata: names, shapes, types and the bytes of each.

gguf-py's GGUFReader builds every metadata value as numpy views, one string at a time: the 49,152 tokens and
48,900 merges of the embedded model's vocabulary take it about 11 s on a 2-core EPYC, for a table of 270 tensors
the forward wants (a 262k-token vocabulary takes a minute). This reads the layout of the GGUF specification
(the gguf.md of github.com/ggml-org/ggml) directly: the header, each key-value skipped by its length (a string
array by a loop over lengths, no object per item) except `general.alignment`, then the tensor infos, and maps
the data. Versions 2 and 3 (64-bit counts), little-endian, as llama.cpp writes them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
STRING, ARRAY, UINT32 = 8, 9, 4
# bytes of each fixed-size value type: uint8, int8, uint16, int16, uint32, int32, float32, bool, -, -, uint64,
# int64, float64
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]  # as GGUF lists it: the fastest-moving axis first
    tensor_type: int  # a ggml type id (gguf.GGMLQuantizationType)
    data: np.ndarray  # its bytes, uint8, mapped read-only from the file


class GGUFTableError(ValueError):
    """The file is not a GGUF this reader knows (magic, version, a value type) or is cut short."""


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise GGUFTableError("the file ends inside its header")
        out = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return out[0] if len(out) == 1 else out

    def string(self) -> str:
        n = self.take("<Q")
        out = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return out

    def skip_value(self, vtype: int) -> None:
        if vtype in FIXED:
            self.pos += FIXED[vtype]
        elif vtype == STRING:
            n = self.take("<Q")
            self.pos += n
        elif vtype == ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item in FIXED:
                self.pos += FIXED[item] * count
            elif item == STRING:
                buf, pos = self.buf, self.pos
                for _ in range(count):  # each string: its 64-bit length, then its bytes
                    pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
                self.pos = pos
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise GGUFTableError(f"unknown GGUF value type {vtype}")


def _nbytes(shape: tuple[int, ...], tensor_type: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(tensor_type)]
    n = int(np.prod(shape, dtype=np.int64))
    if n % block:
        raise GGUFTableError(f"{n} elements do not fill blocks of {block}")
    return n // block * size


def read_table(path: str | Path) -> list[TensorEntry]:
    """Every tensor of the GGUF at `path`, in file order."""
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        return _read(path, mapped)
    except struct.error:  # a length that points past the end (the skip loops read unchecked)
        raise GGUFTableError("the file ends inside its header") from None


def _read(path, mapped) -> list[TensorEntry]:
    cur = _Cursor(memoryview(mapped))
    if bytes(mapped[:4]) != MAGIC:
        raise GGUFTableError(f"{Path(path).name} is not a GGUF file")
    cur.pos = 4
    version = cur.take("<I")
    if version not in (2, 3):
        raise GGUFTableError(f"GGUF version {version} is not read here (2 and 3 are)")
    n_tensors, n_kv = cur.take("<Q"), cur.take("<Q")
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key, vtype = cur.string(), cur.take("<I")
        if key == "general.alignment" and vtype == UINT32:
            alignment = cur.take("<I")
        else:
            cur.skip_value(vtype)
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.take("<I")
        shape = tuple(cur.take("<Q") for _ in range(n_dims))
        infos.append((name, shape, cur.take("<I"), cur.take("<Q")))
    start = -(-cur.pos // alignment) * alignment
    out = []
    for name, shape, tensor_type, offset in infos:
        begin = start + offset
        end = begin + _nbytes(shape, tensor_type)
        if end > len(mapped):
            raise GGUFTableError(f"tensor {name} runs past the end of the file")
        out.append(TensorEntry(name, shape, tensor_type, mapped[begin:end]))
    return out
