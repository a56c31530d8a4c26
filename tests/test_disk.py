"""What the app leaves on disk: run folders rotated and removed (ui/run_folders.py), the model cache capped and
pruned least recently used (engine/load/disk_cache.py), uploads bounded and deleted by Gradio (ui/app.py)."""

import os
import time
from types import SimpleNamespace

import pytest
import torch

from engine.forward.mapped import map_tensor
from engine.forward.mapped import mark_entry
from engine.load.disk_cache import CAP_ENV, building, entries, prune
from engine.load.errors import ModelLoadError
from engine.load.models import load_model
from tiny import suite_dtype
from ui.run_folders import RunFolders


def test_run_folders_keep_the_latest_of_each_kind_and_go_at_exit():
    folders = RunFolders(keep=2)
    bench = [folders.new("bench") for _ in range(4)]
    arena = folders.new("arena")
    assert [p.is_dir() for p in bench] == [False, False, True, True] and arena.is_dir()
    assert {p.parent for p in bench + [arena]} == {folders.root}
    root = folders.root
    folders.remove_all()
    assert not root.exists()
    assert folders.new("bench").is_dir() and folders.root != root  # a new run after that still gets a folder
    folders.remove_all()


def test_the_arena_tab_writes_into_the_apps_run_folders(tiny_target):
    from engine.serve.engine import Engine
    from engine.serve.scheduler import Scheduler
    from ui import arena_tab

    scheduler = Scheduler(Engine(tiny_target, n_ctx=1024, n_seq_max=1, n_draft=4, calibrate=False))
    app = SimpleNamespace(runtime=SimpleNamespace(target=tiny_target, draft=None, engine=scheduler.engine,
                                                  scheduler=scheduler), run_folders=RunFolders(keep=1))
    try:
        first = arena_tab.run_arena_tab(app, "w5 w6 w7 w5 w6 w7", n_max=2, max_new_tokens=4)[2]
        second = arena_tab.run_arena_tab(app, "w5 w6 w7 w5 w6 w7", n_max=2, max_new_tokens=4)[2]
    finally:
        scheduler.close()
    assert second.is_file() and not first.parent.exists()  # the older run's folder went with the newer run
    assert second.parent.parent == app.run_folders.root
    app.run_folders.remove_all()
    assert not second.exists()


def make_entry(root, name, size, age_s):
    """A cache entry of `size` bytes last used `age_s` seconds ago: a conversion folder or a mapped table."""
    path = root / name
    if name.endswith("-f32"):
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"\0" * size)
        mark_entry(path)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * size)
        mark_entry(path.parent)
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


def test_the_cache_is_pruned_least_recently_used_down_to_its_cap(tmp_path):
    old = make_entry(tmp_path, "a-0000-f32", 4000, age_s=300)
    table = make_entry(tmp_path, "mapped/t1-float32-8x8.bin", 3000, age_s=200)
    recent = make_entry(tmp_path, "b-1111-f32", 2000, age_s=100)
    foreign = tmp_path / "someone.gguf"
    foreign.write_bytes(b"\0" * 50_000)  # not the cache's own: never counted, never removed
    own = tmp_path / "mine-9999-f32"  # a user's folder named like an entry, without the cache's marker
    own.mkdir()
    (own / "notes.bin").write_bytes(b"\0" * 50_000)
    os.utime(own, (1.0, 1.0))
    now = make_entry(tmp_path, "mapped/t2-float32-8x8.bin", 5000, age_s=0)
    assert [e.path for e in entries(tmp_path)] == [old, table, recent, now]
    assert prune(tmp_path, cap=8000, used_since=time.time() - 10) == [old, table]
    assert recent.exists() and now.exists() and foreign.exists() and (own / "notes.bin").exists()
    # what the current load used stays even over the cap
    assert prune(tmp_path, cap=0, used_since=time.time() - 10) == [recent]
    assert now.exists()


def test_a_reused_mapped_table_is_marked_as_used(tmp_path):
    t = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    assert map_tensor(t, tmp_path) is not None
    (path,) = tmp_path.glob("*.bin")
    os.utime(path, (1000.0, 1000.0))
    mapped, _ = map_tensor(t, tmp_path)
    assert torch.equal(mapped, t) and path.stat().st_mtime > time.time() - 60


def test_a_second_builder_of_an_entry_waits_for_the_first(tmp_path):
    """Two processes (two apps, two test workers) converting the same file: the second finds the first's copy."""
    import threading

    entry, order = tmp_path / "model-f32", []

    def build(name):
        with building(entry):
            order.append((name, entry.exists()))
            if not entry.exists():
                time.sleep(0.3)
                entry.mkdir()

    first = threading.Thread(target=build, args=("first",))
    first.start()
    time.sleep(0.1)
    build("second")
    first.join()
    assert order == [("first", False), ("second", True)]
    assert entries(tmp_path) == []  # the lock file beside it is no entry of the cache


def test_a_load_prunes_the_cache_and_a_bad_cap_is_refused(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPLAY_CACHE", str(tmp_path))
    stale = make_entry(tmp_path, "old-2222-f32", 3_000_000, age_s=3600)
    kept = make_entry(tmp_path, "mapped/t3-float32-8x8.bin", 1_000_000, age_s=60)
    monkeypatch.setenv(CAP_ENV, "0.002")  # 2 MB: the stale conversion must go, the newer table fits
    load_model(str(tiny_dirs["target"]), device="cpu", dtype=suite_dtype())
    assert not stale.exists() and kept.exists()
    for bad in ("lots", "-1", "nan", "inf"):
        monkeypatch.setenv(CAP_ENV, bad)
        with pytest.raises(ModelLoadError, match=f"{CAP_ENV} must be a number of gigabytes"):
            load_model(str(tiny_dirs["target"]), device="cpu", dtype=suite_dtype())


def test_uploads_are_bounded_and_deleted_by_gradio(tmp_path, monkeypatch):
    """The page's one upload (the Benchmark tab's traces.csv) is refused past UPLOAD_MAX with 413, and what is
    uploaded is among the files that Blocks(delete_cache=...) deletes (hourly, and all at the server's end)."""
    gr = pytest.importorskip("gradio")
    from fastapi.testclient import TestClient
    from gradio import utils

    from ui.app import DELETE_CACHE, UPLOAD_MAX, build, launch_options
    from ui.state import AppOptions, AppState

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    demo = build(AppState(runtime=None, options=AppOptions(parallel=1)))
    uploads = [type(b).__name__ for b in demo.blocks.values()
               if type(b).__name__ in ("File", "UploadButton", "Image", "Audio", "Video", "MultimodalTextbox")]
    assert uploads == ["File"] and demo.delete_cache == DELETE_CACHE
    demo.max_file_size = utils._parse_file_size(launch_options()["max_file_size"])  # what launch() does with it
    assert demo.max_file_size == UPLOAD_MAX
    with TestClient(gr.routes.App.create_app(demo)) as http:
        big = http.post("/gradio_api/upload", files={"files": ("big.csv", b"a,b\n" * (UPLOAD_MAX // 4 + 1),
                                                                "text/csv")})
        small = http.post("/gradio_api/upload", files={"files": ("small.csv", b"a,b\n1,2\n", "text/csv")})
        assert big.status_code == 413 and small.status_code == 200
        (kept,) = small.json()
        assert demo.upload_file_set == {kept} and os.path.isfile(kept)
    assert not os.path.exists(kept)  # the server's end deleted it
