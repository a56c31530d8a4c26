"""Where and how a traces.csv row was measured: the code's commit, the CPU and its vector extensions, the
forwards' threads and device, the date, the model file's sha256, the command that ran and its repeats and
warm-ups, so that rows from different hosts, days and files are never compared unknowingly and a run can be
repeated as it was."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")  # the kernels'
COLUMNS = ["commit", "cpu", "cpu_flags", "threads", "date", "device", "model_sha256", "command", "repeats", "warmups"]
HASH_CHUNK = 1 << 24  # bytes read at a time while hashing a model file


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


def file_sha256(path: Path) -> str:
    """The sha256 of a file, kept beside the cache's other derived data under its fingerprint (a 5 GB file takes
    tens of seconds to hash; its fingerprint reads two MiB)."""
    import hashlib

    from engine.load.gguf import cache_dir, gguf_fingerprint

    memo = cache_dir() / "sha256" / f"{path.name}-{gguf_fingerprint(path)}"
    try:
        return memo.read_text().strip()
    except OSError:
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            h.update(chunk)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(h.hexdigest())
    except OSError:
        pass  # a read-only cache: hashed again next time
    return h.hexdigest()


def model_sha256(name: str) -> str:
    """The sha256 of the file a model name stands for (a GGUF, packaged or not); for a directory, of its weight and
    config files' names and hashes in order; "" for a hub id or what cannot be read."""
    from engine.load.errors import ModelLoadError
    from engine.load.models import gguf_source

    try:
        path = gguf_source(name)
        if path is not None:
            return file_sha256(path)
        folder = Path(name).expanduser()
        if not folder.is_dir():
            return ""
        import hashlib

        h = hashlib.sha256()
        for f in sorted(folder.iterdir()):
            if f.is_file() and f.suffix in (".safetensors", ".bin", ".gguf", ".json", ".model"):
                h.update(f"{f.name}\0{file_sha256(f)}\n".encode())
        return h.hexdigest()
    except (OSError, ModelLoadError):
        return ""


def provenance(threads: int | None = None, device: str = "cpu", model: str = "", command: str = "",
               repeats: int | str = "", warmups: int | str = "") -> dict:
    """The provenance columns' values for rows measured now; threads: the forwards' (torch's count when None);
    model: the target's name or path, hashed; command: the launch command line."""
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    name, flags = cpu()
    return {"commit": commit(), "cpu": name, "cpu_flags": flags, "threads": threads,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"), "device": device,
            "model_sha256": model_sha256(model) if model else "", "command": command, "repeats": repeats,
            "warmups": warmups}
