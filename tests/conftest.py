import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny import load_tiny, save_tiny, suite_dtype  # noqa: E402


def pytest_configure(config):
    """Under pytest-xdist each of the two workers computes on one core: two processes of two threads each would
    fight over two cores."""
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_runtest_setup(item):
    """torch's global generator from one seed before each test and its fixtures: draws that nobody seeded do not
    depend on the tests that ran before (pytest-randomly reseeds `random` and numpy, not torch)."""
    import torch

    torch.manual_seed(0)


# the modules that take minutes (seconds on a 2-core EPYC, call and set-up; CONTRIBUTING.md, "The slowest tests"):
# run first, so that the last minutes of a run are short tests both workers share, not one worker's long one
LONG_MODULES = {"test_load_long": 280, "test_long_prompts": 200, "test_embedded": 200, "test_gguf_direct": 200,
                "test_random_gguf": 180, "test_soak": 135, "test_gemma3": 130, "test_browser": 120}


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle: within and among the rest, its order stands
def pytest_collection_modifyitems(config, items):
    """The long modules first, longest first (xdist's worksteal hands each worker a contiguous run of the
    order; an idle worker then takes the end of the other's)."""
    items.sort(key=lambda item: -LONG_MODULES.get(item.path.stem, 0))


def pytest_terminal_summary(terminalreporter, config):
    """The order's seed again at the end: pytest-randomly prints it in the header, which -q leaves out."""
    if config.pluginmanager.hasplugin("randomly"):
        terminalreporter.write_line(f"random order: rerun with -p randomly --randomly-seed="
                                    f"{config.getoption('randomly_seed')}")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        "target": save_tiny(root / "target", seed=0),
        "draft": save_tiny(root / "draft", seed=1),
        "other_vocab": save_tiny(root / "other", seed=2, words=["<unk>", "<s>", "</s>", "<pad>", "<sep>"]
                                 + [f"v{i}" for i in range(59)]),
    }


@pytest.fixture(scope="session")
def tiny_target(tiny_dirs):
    return load_tiny(tiny_dirs["target"])


@pytest.fixture(scope="session")
def tiny_draft(tiny_dirs):
    return load_tiny(tiny_dirs["draft"])


@pytest.fixture(scope="session")
def embedded():
    from engine.load.models import load_model

    return load_model("embedded", dtype=suite_dtype())


@pytest.fixture()
def bench_prompts(tmp_path):
    """A prompts file for `python -m engine.bench`: a plain prompt that repeats itself and a chat one."""
    path = tmp_path / "p.jsonl"
    rows = [{"id": "loop", "prompt": "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2"},
            {"id": "chat", "messages": [{"role": "user", "content": "w7 w8 w9 w7 w8"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path
