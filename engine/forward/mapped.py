"""A tied embedding table read through a file mapping: the one in-memory copy of the weights is the packed LM head.

When the LM head shares the embedding matrix (SmolLM2, Llama 3.2, Qwen2 small models), prepacking gives the LM
head its own packed copy (engine/forward/prepack.py), and the embedding keeps the original: the table twice in memory,
113 MB for the embedded model in float32. A forward reads only the rows of its tokens from the embedding, so the
table can live in a file that is mapped copy-on-write, as llama.cpp maps its weights (llama-mmap.cpp): only
the pages of rows actually looked up become resident, and the kernel may drop them again since they are clean.
The values are the same bits; nothing is computed differently.

The file is named by a hash of the table's bytes, so a table is written once per model and dtype and a changed
model never reads a stale file. Where the cache directory cannot be written the table stays in memory.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn


# a file in each folder the cache writes: the pruning removes only what carries it (engine/load/disk_cache.py),
# never a folder of the user's own that happens to have a matching name
CACHE_MARKER = ".specplay-cache-entry"


def mark_entry(folder: Path) -> None:
    """Say that `folder` was written by the cache (a read-only cache stays as it is)."""
    try:
        (folder / CACHE_MARKER).touch()
    except OSError:
        pass


def _storage_dtype(dtype: torch.dtype):
    """numpy has no bfloat16: a bfloat16 table is stored and mapped as uint16 and viewed back."""
    return {torch.float32: np.float32, torch.bfloat16: np.uint16, torch.float16: np.float16}.get(dtype)


def map_tensor(t: torch.Tensor, folder: Path) -> tuple[torch.Tensor, np.memmap] | None:
    """`t`'s values in a tensor over a copy-on-write mapping of a file in `folder`, with the mapping; None where
    it cannot be written or mapped."""
    np_dtype = _storage_dtype(t.dtype)
    if np_dtype is None or t.device.type != "cpu":
        return None
    data = memoryview(t.detach().contiguous().view(torch.uint8).numpy()).cast("B")
    digest = hashlib.blake2b(data, digest_size=16).hexdigest()
    path = folder / f"{digest}-{str(t.dtype).removeprefix('torch.')}-{'x'.join(map(str, t.shape))}.bin"
    try:
        if not path.is_file() or path.stat().st_size != len(data):
            folder.mkdir(parents=True, exist_ok=True)
            mark_entry(folder)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
            tmp.rename(path)
        else:
            _touch(path)
        arr = np.memmap(path, dtype=np_dtype, mode="c", shape=tuple(t.shape))
    except (OSError, ValueError):
        return None
    mapped = torch.from_numpy(arr)
    return (mapped.view(torch.bfloat16) if t.dtype == torch.bfloat16 else mapped), arr


def _touch(path: Path) -> None:
    """Mark a reused table as used now: the cache is pruned least recently used (engine/load/disk_cache.py)."""
    try:
        os.utime(path)
    except OSError:  # a read-only cache: the table is still mapped, only never marked
        pass


def drop_resident(t: torch.Tensor) -> None:
    """Let the kernel take back the pages of a mapped tensor that a full read (a checksum) made resident; they
    are read from the file again when used. A no-op for a tensor in ordinary memory."""
    mm = getattr(getattr(t, "_mapped_array", None), "_mmap", None)
    if mm is not None and hasattr(mm, "madvise"):
        mm.madvise(mmap.MADV_DONTNEED)


def map_tied_embedding(model: nn.Module, folder: Path) -> bool:
    """Move the input embedding to a file mapping when the LM head has a packed copy of it; whether it moved."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if emb is None or head is None or not hasattr(head, "_packed_weight"):
        return False
    weight = emb.weight
    if hasattr(weight, "_mapped_array"):
        return True  # mapped at its load (engine/load/gguf_direct.py)
    if getattr(head, "weight", None) is not weight:
        return False  # not tied: the embedding is the one copy of its matrix already
    found = map_tensor(weight, folder)
    if found is None:
        return False
    param = nn.Parameter(found[0], requires_grad=False)
    param._mapped_array = found[1]  # the mapping lives as long as the parameter
    emb.weight = param
    head.weight = param  # keep the tie for code that reads the head's weight (a draft head's rows)
    return True
