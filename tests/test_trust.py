"""What the app trusts: only kernels from a cache no other user can write, no model loads from the page when the
app is reachable from elsewhere, no remote code for a visitor's load, data files read as data, a converted
model keyed by its file, and parameters that cannot poison a sampler."""

import os
import shutil
import stat
from argparse import Namespace
from pathlib import Path

import pytest
import torch

import app
from engine.forward.kernels import build
from engine.sampling import SamplerParams

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def _library_name(tmp_path: Path, monkeypatch) -> str:
    """The file name a build of cell_attention gets here (its name is predictable: a hash of what went in)."""
    monkeypatch.setenv("SPECPLAY_CACHE", str(tmp_path / "probe"))
    lib, where = build.build("cell_attention")
    assert lib is not None, where
    return Path(where).name


@needs_cc
def test_a_cache_others_can_write_is_not_trusted(tmp_path, monkeypatch):
    """Another local user plants a library under the predictable name in a cache directory they can write:
    the build ignores it and loads one of its own from a fresh private directory."""
    name = _library_name(tmp_path, monkeypatch)
    shared = tmp_path / "shared"
    (shared / "kernels").mkdir(parents=True)
    os.chmod(shared / "kernels", 0o777)
    planted = shared / "kernels" / name
    planted.write_bytes(b"not a library: loading it would fail")
    monkeypatch.setenv("SPECPLAY_CACHE", str(shared))
    lib, where = build.build("cell_attention")
    assert lib is not None, where
    assert Path(where).parent != planted.parent and not Path(where).parent.exists(), "a fresh, removed directory"


@needs_cc
def test_a_private_cache_is_used_and_a_loose_file_in_it_is_built_again(tmp_path, monkeypatch):
    name = _library_name(tmp_path, monkeypatch)
    mine = tmp_path / "mine"
    (mine / "kernels").mkdir(parents=True)
    os.chmod(mine / "kernels", 0o755)  # an older version's directory: ours, nobody else writes it
    monkeypatch.setenv("SPECPLAY_CACHE", str(mine))
    planted = mine / "kernels" / name
    planted.write_bytes(b"junk")
    os.chmod(planted, 0o666)  # writable by others: not trusted
    lib, where = build.build("cell_attention")
    assert lib is not None and Path(where) == planted
    assert stat.S_IMODE(os.stat(mine / "kernels").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(planted).st_mode) & 0o022 == 0
    assert build.private(mine / "kernels") and not build.private(tmp_path / "nowhere")


def _args(argv: list[str]) -> Namespace:
    return app.parse_args(argv)


def test_model_loading_is_off_wherever_the_app_is_reachable_from_elsewhere(monkeypatch):
    monkeypatch.delenv("GRADIO_SHARE", raising=False)
    assert app.model_load_allowed(_args([]))
    assert not app.model_load_allowed(_args(["--host", "0.0.0.0", "--api-key", "k" * 16]))
    assert not app.model_load_allowed(_args(["--share", "--api-key", "k" * 16]))
    assert app.model_load_allowed(_args(["--share", "--allow-model-load", "--api-key", "k" * 16]))
    monkeypatch.setenv("GRADIO_SHARE", "True")  # Gradio would make a public link of its own accord
    args = _args(["--api-key", "k" * 16])
    assert args.share and not app.model_load_allowed(args)


def test_a_page_load_never_runs_remote_code(monkeypatch):
    """--trust-remote-code applies to the models on the command line, never to a name a visitor types."""
    seen = []

    def fake_load(name, device="cpu", trust_remote_code=False, dtype="auto"):
        seen.append((name, trust_remote_code))
        return object()

    monkeypatch.setattr("engine.load.models.load_model", fake_load)
    monkeypatch.setattr("ui.loader.make_runtime", lambda target, draft, options, on_event=None: None)
    state = app.load_state(_args(["--trust-remote-code", "--target", "mine", "--allow-hub-models"]))
    state.loader("someone/a-visitors-model")
    assert seen == [("mine", True), ("someone/a-visitors-model", False)]


def test_the_worker_threads_outnumber_slots_and_queue():
    from ui.app import SPARE_THREADS, launch_options
    from ui.state import AppOptions

    assert launch_options(AppOptions(parallel=4, queue_max=64))["max_threads"] == 4 + 64 + SPARE_THREADS


class _Runs:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_a_training_cache_file_is_read_as_data_only(tmp_path, monkeypatch):
    from training import data

    path = tmp_path / "data.pt"
    torch.save({"records": [_Runs()], "params": {}}, path)
    built = {"records": [], "params": data.DataParams().__dict__}
    monkeypatch.setattr(data, "build", lambda target, params, held_out: built)
    ran = []
    monkeypatch.setattr(os, "system", lambda cmd: ran.append(cmd))
    assert data.load_or_build(path, None, data.DataParams(), []) == built
    assert ran == [], "unpickling the file ran code"
    assert torch.load(path, weights_only=True) == built, "made again and written over the planted file"


def test_two_gguf_files_of_one_name_get_their_own_converted_copy(tmp_path, monkeypatch):
    from engine.load import gguf

    monkeypatch.setenv("SPECPLAY_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a" / "model.Q4_1.gguf", tmp_path / "b" / "model.Q4_1.gguf"
    for path, body in ((a, b"GGUF one"), (b, b"GGUF two")):
        path.parent.mkdir()
        path.write_bytes(body)
    assert gguf._converted_dir(a) != gguf._converted_dir(b)
    before = gguf._converted_dir(a)
    a.write_bytes(b"GGUF one, rewritten")
    assert gguf._converted_dir(a) != before


@pytest.mark.parametrize("field,value", [("temp", float("nan")), ("temp", float("inf")), ("top_p", float("nan")),
                                         ("min_p", float("nan")), ("seed", 2 ** 64), ("seed", 2 ** 63),
                                         ("seed", -1), ("seed", 1.5), ("top_k", 2.0)])
def test_sampler_parameters_that_would_poison_a_draw_are_refused(field, value):
    with pytest.raises(ValueError, match=field.replace("temp", "temperature")):
        SamplerParams(**{field: value}).validate()
    SamplerParams(seed=2 ** 63 - 1, temp=0.7).validate()
