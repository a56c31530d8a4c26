"""Compile the engine's C kernels for this host and load them with ctypes.

A kernel is built once per source, compiler and CPU (it is compiled with -march=native) into a cache directory
(`$SPECPLAY_CACHE`, else `~/.cache/specplay`; the temporary folder where that cannot be written), in a second
or so, and loaded from there afterwards. Without a C compiler, or if the build fails, the caller gets None and
the reason, and uses its torch path instead.

OpenMP: torch ships its own libgomp.so.1 and loads it first, so the kernel's `libgomp.so.1` resolves to that
same runtime and its parallel loops share torch's threads instead of starting a second pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-shared", "-fPIC"]


def cache_dir() -> Path:
    return Path(os.environ.get("SPECPLAY_CACHE") or Path.home() / ".cache" / "specplay") / "kernels"


def _writable_dir() -> Path:
    """The cache directory, or one under the system's temporary folder where the cache cannot be written: a
    read-only cache must not make one load of a model run other kernels (other bits) than the next."""
    for where in (cache_dir(), Path(tempfile.gettempdir()) / f"specplay-kernels-{os.getuid()}"):
        try:
            where.mkdir(parents=True, exist_ok=True)
            if os.access(where, os.W_OK):
                return where
        except OSError:
            continue
    return cache_dir()


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo ("flags" on x86, "Features" on ARM); empty where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _source_text(source: Path) -> str:
    """The source and the local files it includes (`#include "x.c"`): a change to any of them is a new build."""
    text = source.read_text()
    included = re.findall(r'^#include "([^"]+)"', text, flags=re.M)
    return "\0".join([text, *(_source_text(HERE / name) for name in included)])


def build(name: str, defines: tuple[str, ...] = ()) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, where it came from) or (None, why not) for HERE/<name>.c, compiled with these
    -D options (one source may build several kernels)."""
    source = HERE / f"{name}.c"
    cc = _compiler()
    if cc is None:
        return None, "no C compiler (cc) found"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cc} --version failed: {e}"
    flags = [*FLAGS, *(f"-D{d}" for d in defines)]
    key = hashlib.sha256("\0".join([_source_text(source), version, " ".join(flags),
                                    " ".join(sorted(cpu_flags()))]).encode())
    target = _writable_dir() / f"{name}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        try:
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                out = Path(tmp) / target.name
                done = subprocess.run([cc, *flags, "-o", str(out), str(source), "-lm"], capture_output=True,
                                      text=True, timeout=300)
                if done.returncode != 0:
                    return None, f"{cc} could not build {source.name}: {done.stderr.strip()[-300:]}"
                os.replace(out, target)  # atomic: a concurrent build leaves one whole file
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"building {source.name} failed: {e}"
    try:
        return ctypes.CDLL(str(target)), str(target)
    except OSError as e:
        return None, f"loading {target} failed: {e}"
