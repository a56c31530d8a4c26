"""Conformance over model families: transformers' own generate() is the truth. Each family's tiny model
(tests/families.py: its real config class, random weights, float32, windows of 16 positions) decodes greedily
three windows' worth of tokens past a prompt longer than the window through the engine: plain, the n-gram chain,
trees, two slots in one batch and the checkpoint path, token-identical to stock generate() on the same weights.
Families whose positions the cell cache cannot express are refused at load with the reason; a window given to a
global layer makes the comparison fail."""

import pytest
import torch

from engine.draft.registry import NGRAM_CHAIN
from engine.load.models import ModelLoadError, load_model
from engine.forward.lean import LeanForward
from engine.memory import context
from engine.memory.layer_kinds import FULL, SLIDING, LayerKinds, layer_kinds
from engine.params import GenParams, SpecParams
from engine.serve.engine import Engine
from families import FAMILIES, REFUSED, WINDOW, build, save_family
from fresh import forgetting
from test_engine import SMALL_NGRAMS, tokens

N_NEW = 3 * WINDOW
# longer than the window, with repeats for the n-gram drafters to find
PROMPTS = [[1] + [5 + (i * 7) % 50 for i in range(WINDOW + 4)],
           [1] + [10 + i % 6 for i in range(WINDOW + 9)]]
# the heavy modes on families that stand for each way a layer attends: the lean forward (llama), windowed and
# global layers with their masks and rows by kind (gemma3, qwen2), soft-capped scores on an eager model
# (gemma2), a model that reads the 4D mask in its own attention (falcon), layers without rotary positions (smollm3)
HEAVY = ["llama", "gemma3", "gemma2", "qwen2", "falcon", "smollm3"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread: a 64-wide model's kernels wait on each other at a barrier more than they compute, and on a
    busy machine the second thread's wait costs tens of milliseconds per call."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: save_family(root, f) for f in FAMILIES}


@pytest.fixture(scope="module")
def stock(dirs):
    """Stock generate() on each family's saved weights (a fresh model: no packing, no attention switched)."""
    from transformers import AutoModelForCausalLM

    cache = {}

    def greedy(family: str, prompt: list[int], n: int = N_NEW) -> list[int]:
        if (family, tuple(prompt), n) not in cache:
            model = AutoModelForCausalLM.from_pretrained(dirs[family]).eval()
            with torch.inference_mode():
                out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                                     pad_token_id=3, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
            cache[(family, tuple(prompt), n)] = out[0, len(prompt):].tolist()
        return cache[(family, tuple(prompt), n)]

    return greedy


@pytest.fixture(scope="module")
def built():
    """family -> its engine, built at the first test that asks for it."""
    return {}


fresh_engines = forgetting("built")


@pytest.fixture()
def engines(dirs, built):
    def get(family: str) -> Engine:
        if family not in built:
            built[family] = Engine(load_model(str(dirs[family]), device="cpu"), n_ctx=512, n_seq_max=2,
                                   calibrate=False, drafter_params=SMALL_NGRAMS)
        return built[family]

    return get


def _params(types, tree_nodes=0, rollback="auto", n=N_NEW) -> GenParams:
    return GenParams(max_new_tokens=n, ignore_eos=True,
                     spec=SpecParams(types=list(types), n_max=6, adaptive=False, p_min=0.0, tree_nodes=tree_nodes,
                                     rollback=rollback))


def _run(engine, prompt, types, **kw):
    return list(engine.generate(prompt, _params(types, **kw)))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_plain_and_the_ngram_chain_are_stock_generate(family, engines, stock):
    engine = engines(family)
    n_spec = 0
    for prompt in PROMPTS:
        want = stock(family, prompt)
        assert tokens(_run(engine, prompt, [])) == want, engine.ctx.describe_forward()
        events = _run(engine, prompt, NGRAM_CHAIN)
        assert tokens(events) == want
        n_spec += sum(e.kind == "spec" for e in events)
    assert n_spec > 0, "no draft was ever verified: the chain would not be tested"


@pytest.mark.parametrize("family", HEAVY)
def test_trees_slots_and_checkpoints_are_stock_generate(family, engines, stock):
    engine = engines(family)
    n_tree = n_replay = 0
    for prompt in PROMPTS:
        want = stock(family, prompt)
        events = _run(engine, prompt, NGRAM_CHAIN + ["synthetic"], tree_nodes=12)
        assert tokens(events) == want
        n_tree += sum(e.verify_mode == "tree" for e in events if e.kind == "spec")
        events = _run(engine, prompt, NGRAM_CHAIN + ["synthetic"], rollback="checkpoint")
        assert tokens(events) == want
        n_replay += sum(e.kind == "replay" for e in events)
    assert n_tree > 0 and n_replay > 0, "no tree verified or no checkpoint restored"
    # two slots in one batch, each with its own prompt
    for seq in list(engine.slots):
        engine.release(seq)
    got = {0: [], 1: []}
    for seq, prompt in enumerate(PROMPTS):
        engine.start(prompt, _params(NGRAM_CHAIN + ["synthetic"]), seq=seq)
    n_rows = 0
    while engine.active():
        for e in engine.step():
            got[e.seq].extend(e.emitted)
            n_rows = max(n_rows, e.batch_rows if e.kind != "prefill" else 0)
    assert [got[0], got[1]] == [stock(family, p) for p in PROMPTS]
    assert n_rows > 2, "the two slots were never verified in one forward"
    for seq in range(2):
        engine.release(seq)


@pytest.mark.parametrize("family", list(REFUSED))
def test_a_family_whose_positions_cells_cannot_express_is_refused(family, tmp_path):
    path = save_family(tmp_path, family)
    with pytest.raises(ModelLoadError, match=REFUSED[family][3]) as err:
        load_model(str(path), device="cpu")
    assert family.split("-")[0] in str(err.value)


def test_a_window_on_a_global_layer_fails_the_comparison(engines, stock):
    """The suite can fail: give gemma3's global layers the window of its local ones, and plain decoding is no
    longer stock generate()."""
    engine = engines("gemma3")
    cache = engine.ctx.cache
    right = cache.kinds
    cache.kinds = LayerKinds(types=right.types, windows={kind: WINDOW for kind in right.windows})
    try:
        wrong = [tokens(_run(engine, p, [])) for p in PROMPTS]
    finally:
        cache.kinds = right
    assert any(w != stock("gemma3", p) for w, p in zip(wrong, PROMPTS))
    assert [tokens(_run(engine, p, [])) for p in PROMPTS] == [stock("gemma3", p) for p in PROMPTS]


def test_each_kind_of_layer_gets_its_own_window():
    kinds = layer_kinds(build("gemma3").config)
    assert kinds.types == (SLIDING, FULL) and kinds.windows == {SLIDING: WINDOW, FULL: None}
    assert not kinds.uniform and kinds.smallest_window == WINDOW
    qwen2 = layer_kinds(build("qwen2").config)
    assert qwen2.types == (FULL, SLIDING)
    assert layer_kinds(build("mistral").config).uniform
    smol = build("smollm3")
    assert layer_kinds(smol.config).windows == {FULL: None}
    with pytest.raises(ValueError, match="layer_types names 3 layers"):
        cfg = build("llama").config
        cfg.layer_types = [FULL] * 3
        layer_kinds(cfg)


@pytest.mark.parametrize("family", ["gemma3", "mistral", "qwen2"])
def test_the_load_check_runs_past_the_smallest_window(family, engines):
    check = engines(family).load_check
    assert check.passed is True and check.lossless_shown
    assert f"past the {WINDOW}-position window" in check.detail


def test_without_a_window_the_load_check_is_the_probe(engines):
    check = engines("llama").load_check
    assert check.passed is True and "probe" in check.detail


def test_a_forward_that_disagrees_with_transformers_is_refused_at_load(dirs, monkeypatch):
    right = context.layer_kinds

    def windowed_everywhere(cfg):
        kinds = right(cfg)
        return LayerKinds(types=kinds.types, windows={kind: WINDOW for kind in kinds.windows})

    monkeypatch.setattr(context, "layer_kinds", windowed_everywhere)
    with pytest.raises(ModelLoadError, match="failed its load check.*differs from transformers'"):
        Engine(load_model(str(dirs["gemma3"]), device="cpu"), n_ctx=256, n_seq_max=1, calibrate=False)


def test_a_lean_forward_that_disagrees_gives_way_to_transformers(dirs, stock, monkeypatch):
    lean_call = LeanForward.__call__

    def off_by_one(self, *args):
        logits, hidden = lean_call(self, *args)
        return logits + torch.arange(logits.shape[-1], dtype=logits.dtype), hidden

    monkeypatch.setattr(LeanForward, "__call__", off_by_one)
    engine = Engine(load_model(str(dirs["mistral"]), device="cpu"), n_ctx=256, n_seq_max=1, calibrate=False)
    assert engine.ctx.lean is None and "lean forward disagreed" in engine.ctx.lean_reason
    assert engine.load_check.passed is True
    assert tokens(_run(engine, PROMPTS[0], [])) == stock("mistral", PROMPTS[0])


@pytest.mark.parametrize("n_ctx", [64, 67])
def test_a_context_about_as_short_as_the_window_loads(tmp_path, monkeypatch, n_ctx):
    """A context of no more cells than the window never cuts a row's view, so the check has nothing to cross
    (the probe's verdict stands); a few cells more are checked as far as they reach."""
    import families

    monkeypatch.setitem(families.FAMILIES, "gemma3", (*FAMILIES["gemma3"][:2], {**FAMILIES["gemma3"][2],
                                                                               "sliding_window": 64}))
    engine = Engine(load_model(str(save_family(tmp_path, "gemma3")), device="cpu"), n_ctx=n_ctx, n_seq_max=1,
                    calibrate=False)
    assert engine.load_check.passed is True, engine.load_check.detail
    assert ("past the 64-position window" in engine.load_check.detail) == (n_ctx > 64)
    assert tokens(_run(engine, PROMPTS[0], NGRAM_CHAIN))
