"""Folders for the files a Benchmark or Arena run offers for download: all under one temporary folder of the
app's, the latest KEEP_RUNS of each kind kept, older ones removed as new ones come and the whole folder at exit.

Gradio copies a file it is given to serve into its own cache (which Blocks(delete_cache=...) empties, ui/app.py),
so a run's folder is only needed until its handler returns; the last few are kept for a download still being set
up on another page.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

KEEP_RUNS = 3  # folders kept per kind (bench, arena)


@dataclass
class RunFolders:
    keep: int = KEEP_RUNS
    root: Path | None = None  # made at the first run, removed at exit
    made: dict[str, deque] = field(default_factory=dict)  # kind -> its folders, oldest first
    lock: threading.Lock = field(default_factory=threading.Lock)  # runs of two tabs may end together
    registered: bool = False  # remove_all is registered to run at exit

    def new(self, kind: str) -> Path:
        """A fresh empty folder for a run of `kind`; the oldest of that kind go past `keep`."""
        with self.lock:
            if self.root is None or not self.root.is_dir():
                self.root = Path(tempfile.mkdtemp(prefix="specplay-runs-"))
                if not self.registered:
                    atexit.register(self.remove_all)
                    self.registered = True
            folder = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=self.root))
            kept = self.made.setdefault(kind, deque())
            kept.append(folder)
            while len(kept) > self.keep:
                shutil.rmtree(kept.popleft(), ignore_errors=True)
            return folder

    def remove_all(self) -> None:
        """Remove every run's folder and the app's own (at exit)."""
        with self.lock:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
            self.made.clear()
