"""The same weights at another bit width: a GGUF's Q4_1 matrices requantised to Q8_0.

The quantisation x speculation comparison needs one model at two real bit widths. `embedded-q8` is the embedded
Q4_1 model with each Q4_1 matrix dequantised and quantised again as Q8_0 by gguf-py (`gguf.quants`), every other
tensor and the metadata copied as they are. Q8_0 holds a Q4_1 block's 16 levels within its own rounding (half a
step of max |w| / 127), so the 8-bit model is the 4-bit one plus at most that: the comparison is of bit widths,
not of different weights. The file is written once into the cache directory (engine/load/disk_cache.py prunes it
like the other entries) and then loads through the GGUF path, whose Q8_0 blocks are read as stored
(engine/forward/quant.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.load.disk_cache import building, touch
from engine.load.gguf import gguf_fingerprint

EMBEDDED_Q8 = "embedded-q8"
Q8_SUFFIX = "-q8_0"  # the cache entries' folder names end so (engine/load/disk_cache.py lists them)


def requantised_path(src: Path, root: Path) -> Path:
    """Where the Q8_0 copy of the GGUF at `src` is kept under `root`: a folder named with the source's fingerprint
    (a replaced source gets a new copy) holding `<stem>.Q8_0.gguf`, the stem without the source's own tag (`.Q4_1`).
    A reuse touches the folder, never the file: the file's time is part of its own fingerprint, which names its
    dequantised copy (engine/load/gguf.py)."""
    stem = src.stem.split(".")[0]
    return root / f"{stem}-{gguf_fingerprint(src)}{Q8_SUFFIX}" / f"{stem}.Q8_0.gguf"


def requantised(src: Path, root: Path) -> Path:
    """The Q8_0 copy of `src` under `root`, written now if it is not there yet (atomically: a half-written file
    is never read as a model)."""
    dst = requantised_path(src, root)
    with building(dst.parent):  # a second process wanting the same copy waits for this one's
        if dst.is_file():
            touch(dst.parent)
            return dst
        dst.parent.mkdir(parents=True, exist_ok=True)
        touch(dst.parent)
        tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
        try:
            write_q8_0(src, tmp)
            tmp.replace(dst)
        finally:
            if tmp.exists():
                tmp.unlink()
    return dst


def write_q8_0(src: Path, dst: Path) -> int:
    """Write `src` to `dst` with every Q4_1 matrix as Q8_0; the number of matrices requantised."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize, quantize

    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(dst), arch=arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # the writer's own
        value = field.contents()
        if field.name == "general.file_type":
            value = int(LlamaFileType.MOSTLY_Q8_0)
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    n_requantised = 0
    for t in reader.tensors:
        data, kind = np.asarray(t.data), t.tensor_type
        if kind == GGMLQuantizationType.Q4_1:
            data = quantize(dequantize(data, kind), GGMLQuantizationType.Q8_0)
            kind = GGMLQuantizationType.Q8_0
            n_requantised += 1
        writer.add_tensor(t.name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return n_requantised
