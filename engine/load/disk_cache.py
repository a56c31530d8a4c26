"""The cache directory's own files, capped in size and pruned least recently used.

A load writes or reuses three kinds of entries there: a GGUF's dequantised copy (a folder
`<stem>-<fingerprint>-f32`, engine/load/gguf.py), a GGUF requantised to Q8_0 (a folder `<stem>-<fingerprint>-q8_0`,
engine/load/requant.py) and a tied embedding table mapped from a file (`mapped/<hash>-<dtype>-<shape>.bin`,
engine/forward/mapped.py). An entry's modification time is when a load last used it (a reuse touches it). After
each load, while the entries add up to more than the cap, the least recently used one is removed, never one this
load used: the next load that needs it converts or writes it again. Only folders holding the cache's marker
file (`CACHE_MARKER`, written with the entry) are entries: other files and folders, a user's own `*-f32` among
them, are never touched. The cap is SPECPLAY_CACHE_MAX_GB (gigabytes, CACHE_MAX_GB unless set).

Removing a file that another process has mapped or is reading is safe on POSIX systems: the data stays until the
last handle closes.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.forward.mapped import CACHE_MARKER, mark_entry

CACHE_MAX_GB = 8.0  # the embedded model's entries take 0.6 GB, a 270M model's 1.3 GB
CAP_ENV = "SPECPLAY_CACHE_MAX_GB"


@dataclass
class Entry:
    path: Path
    size: int  # bytes, every file inside a folder entry
    used: float  # its modification time: when a load last wrote or reused it


def cap_bytes() -> int:
    """The cap in bytes, from SPECPLAY_CACHE_MAX_GB. Raises ValueError naming the variable for a bad value."""
    raw = os.environ.get(CAP_ENV)
    if raw is None or not raw.strip():
        return int(CACHE_MAX_GB * 1e9)
    try:
        gb = float(raw)
    except ValueError:
        gb = -1.0
    if not 0.0 <= gb < float("inf"):
        raise ValueError(f"{CAP_ENV} must be a number of gigabytes >= 0, got {raw!r}")
    return int(gb * 1e9)


def touch(path: Path) -> None:
    """Mark an entry (a folder the cache wrote) as used now (a read-only cache stays as it is)."""
    mark_entry(path)
    try:
        os.utime(path)
    except OSError:
        pass


@contextmanager
def building(entry: Path):
    """Held while one process checks for and writes `entry`: a second process (a second app, a test worker)
    waits, then finds the entry written instead of converting the same file again beside it. A cache folder
    that cannot hold the lock file (read-only) is built without one."""
    import fcntl

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        lock = open(entry.with_name(entry.name + ".lock"), "a")
    except OSError:
        yield
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def entries(root: Path) -> list[Entry]:
    """The cache's own entries under `root`, least recently used first."""
    found = [p for p in [*root.glob("*-f32"), *root.glob("*-q8_0")] if (p / CACHE_MARKER).is_file()]
    if (root / "mapped" / CACHE_MARKER).is_file():
        found += list((root / "mapped").glob("*.bin"))
    out = []
    for path in found:
        try:
            out.append(Entry(path, _size(path), path.stat().st_mtime))
        except OSError:  # removed meanwhile by another process
            continue
    return sorted(out, key=lambda e: e.used)


def prune(root: Path, cap: int, used_since: float) -> list[Path]:
    """Remove the least recently used entries until they add up to `cap` bytes or less, keeping every entry
    used at or after `used_since` (the load's start); the removed paths."""
    listed = entries(root)
    total, removed = sum(e.size for e in listed), []
    for e in listed:
        if total <= cap or e.used >= used_since:
            break
        try:
            shutil.rmtree(e.path) if e.path.is_dir() else e.path.unlink()
        except OSError:
            continue
        total -= e.size
        removed.append(e.path)
    return removed
