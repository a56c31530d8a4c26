"""Compile the engine's C kernels for this host and load them with ctypes.

A kernel is built once per set of sources, compiler and CPU (it is compiled with -march=native) into a cache
directory (`$SPECPLAY_CACHE/kernels`, else `~/.cache/specplay/kernels`), in a second or so, and loaded from there
afterwards. A library is code this process runs, so the cache is trusted only when it is private: a directory of
this user's with mode 0700 inside one nobody else can rename it out of, holding files of ours that nobody else
can write. Anything else (a shared or read-only cache) gets a build in a fresh private directory of this
process's own. Without a C compiler, or if the build fails, the caller gets None and the reason, and uses its
torch path instead.

OpenMP: torch ships its own libgomp.so.1 and loads it first, so the kernel's `libgomp.so.1` resolves to that
same runtime and its parallel loops share torch's threads instead of starting a second pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC"]


def cache_dir() -> Path:
    return Path(os.environ.get("SPECPLAY_CACHE") or Path.home() / ".cache" / "specplay") / "kernels"


def private(where: Path) -> bool:
    """Whether `where` is a directory only this user can write: owned by us, no group or other bits (0700), and
    not a link. A library loaded from anywhere else could have been planted there by another local user."""
    try:
        st = os.lstat(where)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
        return False
    try:
        up = os.stat(where.parent)
    except OSError:
        return False
    # a parent others may write (without the sticky bit of /tmp) lets them swap our directory for theirs
    others_write = up.st_mode & 0o022 and not up.st_mode & stat.S_ISVTX
    return up.st_uid in (os.getuid(), 0) and not others_write


def _make_private(where: Path) -> bool:
    """Create `where` (and its parents) for this user with mode 0700, or tighten one of ours that nobody else
    could write into; True if it is private afterwards."""
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        where.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(where)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
            os.chmod(where, 0o700)  # 0755 from an older version: readable by others, written only by us
    except OSError:
        return False
    return private(where)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo ("flags" on x86, "Features" on ARM); empty where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _ours(library: Path) -> bool:
    """Whether `library` exists as a plain file of ours that nobody else can write (else it is built again)."""
    try:
        st = os.lstat(library)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        os.unlink(library)
        return False
    return True


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _source_text(source: Path) -> str:
    """The source and the local files it includes (`#include "x.h"`): a change to any of them is a new build."""
    text = source.read_text()
    included = re.findall(r'^#include "([^"]+)"', text, flags=re.M)
    return "\0".join([text, *(_source_text(HERE / name) for name in included)])


def build(name: str, defines: tuple[str, ...] = (), sources: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, where it came from) or (None, why not) for the library `name`: the files `sources`
    of HERE (HERE/<name>.c if none) compiled and linked together, with these -D options (one source may build
    several kernels). engine/forward/kernels/registry.py lists each library's sources and defines."""
    files = [HERE / f for f in sources] or [HERE / f"{name}.c"]
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (cc) found"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cc} --version failed: {e}"
    flags = [*FLAGS, *(f"-D{d}" for d in defines)]
    key = hashlib.sha256("\0".join([*(_source_text(f) for f in files), version, " ".join(flags),
                                    " ".join(sorted(cpu_flags()))]).encode())
    file_name = f"{name}-{key.hexdigest()[:16]}.so"
    where = cache_dir()
    if _make_private(where) and os.access(where, os.W_OK):
        return _build_at(where / file_name, cc, flags, files)
    # the cache is not ours alone, or cannot be written: a build of this process's own, in a fresh directory
    # (mkdtemp: an unpredictable name, mode 0700) removed once the library is loaded (its mapping stays)
    with tempfile.TemporaryDirectory(prefix="specplay-kernels-") as fresh:
        return _build_at(Path(fresh) / file_name, cc, flags, files)


def _build_at(target: Path, cc: str, flags: list[str], files: list[Path]) -> tuple[ctypes.CDLL | None, str]:
    names = " ".join(f.name for f in files)
    try:
        if not _ours(target):
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                out = Path(tmp) / target.name
                done = subprocess.run([cc, *flags, "-o", str(out), *map(str, files), "-lm"], capture_output=True,
                                      text=True, timeout=300)
                if done.returncode != 0:
                    return None, f"{cc} could not build {names}: {done.stderr.strip()[-300:]}"
                os.chmod(out, 0o700)
                os.replace(out, target)  # atomic: a concurrent build leaves one whole file
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"building {names} failed: {e}"
    try:
        return ctypes.CDLL(str(target)), str(target)
    except OSError as e:
        return None, f"loading {target} failed: {e}"
