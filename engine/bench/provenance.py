"""Where a traces.csv row was measured: the code's commit, the CPU and its vector extensions, the forwards'
threads and the date, so that rows from different hosts and days are never compared unknowingly."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")  # the kernels'
COLUMNS = ["commit", "cpu", "cpu_flags", "threads", "date"]


def commit() -> str:
    """The checkout's commit (with '+' when files differ from it), '' outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+" if dirty else "")


def cpu(cpuinfo: str | None = None) -> tuple[str, str]:
    """(model name, the vector extensions among FLAGS it has, ';'-joined) from /proc/cpuinfo."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "", ""
    model, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, ";".join(f for f in FLAGS if f in flags)


def provenance(threads: int | None = None) -> dict:
    """The provenance columns' values for rows measured now; threads: the forwards' (torch's count when None)."""
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    model, flags = cpu()
    return {"commit": commit(), "cpu": model, "cpu_flags": flags, "threads": threads,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")}
