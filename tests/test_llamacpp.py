"""The optional llama.cpp yardstick (engine.bench.llamacpp): a clear error without it, plain greedy with it."""

import importlib.util

import pytest

from engine.bench import llamacpp

PROMPT_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
              19712, 8182, 2, 198, 1, 4093, 198, 19161, 253, 1890, 8216, 563, 260, 3426, 418, 3163, 30, 2, 198,
              1, 520, 9531, 198]  # "Write a short poem about the sea at night." in SmolLM2's chat template


def test_missing_llama_cpp_raises_with_install_hint(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    assert not llamacpp.available()
    with pytest.raises(llamacpp.LlamaCppUnavailable, match=r"setup\.sh --llamacpp.*requirements-llamacpp\.txt"):
        llamacpp.open_model(n_ctx=256, n_threads=1)


@pytest.fixture(scope="module")
def runner():
    pytest.importorskip("llama_cpp")
    r = llamacpp.open_model(n_ctx=256, n_threads=1)  # one thread: no OpenMP barrier to stall on a busy machine
    yield r
    r.close()


def test_greedy_tokens_stop_at_max_and_repeat(runner):
    first, secs = runner.generate(PROMPT_IDS, max_new_tokens=8, eos_ids=set(), ignore_eos=True)
    assert len(first) == 8 and all(type(t) is int for t in first) and secs > 0
    # exactly our ids went in (no BOS added), then the new ones
    assert runner.evaluated_ids() == PROMPT_IDS + first[:-1]
    again, _ = runner.generate(PROMPT_IDS, max_new_tokens=8, eos_ids=set(), ignore_eos=True)
    assert again == first


def test_stops_at_eos(runner):
    first, _ = runner.generate(PROMPT_IDS, max_new_tokens=8, eos_ids=set(), ignore_eos=True)
    cut, _ = runner.generate(PROMPT_IDS, max_new_tokens=8, eos_ids={first[2]}, ignore_eos=False)
    assert cut == first[:first.index(first[2]) + 1]


def test_prompt_must_fit(runner):
    with pytest.raises(ValueError, match="n_ctx"):
        runner.generate(PROMPT_IDS, max_new_tokens=256, eos_ids=set(), ignore_eos=True)


def test_the_bench_opens_llama_cpp_on_its_threads(monkeypatch):
    """--threads holds for the llama.cpp row too, and a packaged name opens that model's own GGUF file."""
    from types import SimpleNamespace

    from engine.bench.compare import Comparators
    from engine.load.models import gguf_source

    opened = {}
    monkeypatch.setattr(llamacpp, "open_model", lambda path, n_ctx, n_threads=None: opened.update(
        path=path, n_ctx=n_ctx, n_threads=n_threads) or "runner")
    cfg = SimpleNamespace(target="embedded", threads=1)
    assert Comparators.load(["llama.cpp"], cfg, 300).llama == "runner"
    assert opened == dict(path=gguf_source("embedded"), n_ctx=300, n_threads=1)
