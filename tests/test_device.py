"""Every tensor the engine makes lives on the model's device: the engine runs with torch's default device set to
`meta` and every op checked for mixed devices and generators of another device (tests/devicecheck.py), so a
tensor made without its device fails here, on the CPU, as it would on a card. The models run transformers'
forward with SDPA per row, the path a card takes (no packed linears, no C kernel)."""

import pytest
import torch

from fresh import forgetting
from devicecheck import DeviceMixError, strict_devices
from engine.bench.random_models import random_model
from engine.forward.device import resolve_device, synchronize
from engine.draft.head.drafter import DraftHeadParams
from engine.draft.head.net import save_head
from engine.draft.registry import NGRAM_CHAIN
from engine.events import ErrorEvent
from engine.forward.attention import RowAttention
from engine.grammar import GrammarSpec
from engine.load.models import ModelLoadError, load_model, pick_device
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from test_draft_head import tiny_head

PROMPT = [1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
OTHER = [1, 40, 41, 40, 41, 40, 42, 43, 40, 41]


def card_path(engine: Engine) -> Engine:
    """Attention by SDPA per row, as on a card (the C kernel is the CPU's)."""
    engine.ctx.attention = RowAttention(engine.ctx.device, engine.ctx.cache.dtype, use_kernel=False)
    return engine


@pytest.fixture(scope="module")
def models(tiny_dirs):
    return (load_model(str(tiny_dirs["target"]), device="cpu", prepack=False),
            load_model(str(tiny_dirs["draft"]), device="cpu", prepack=False))


@pytest.fixture(scope="module")
def engine(models):
    with strict_devices():  # building it probes the memory; the cost curve is timed apart (slow here)
        return card_path(Engine(models[0], draft=models[1], n_ctx=512, n_seq_max=2, calibrate=False))


def test_the_cost_curve_is_timed_on_the_models_device(models):
    with strict_devices():
        cost = card_path(Engine(models[0], n_ctx=128, n_seq_max=1, n_draft=4, calibrate=False)).calibrate(passes=1)
    assert len(cost.sizes) > 1 and all(s > 0 for s in cost.seconds)


def params(types=(), temp=0.0, tree=0, rollback="auto", n=16, grammar=None) -> GenParams:
    return GenParams(max_new_tokens=n, ignore_eos=grammar is None, sampling=SamplerParams(temp=temp, seed=3),
                     spec=SpecParams(types=list(types), n_max=4, adaptive=False, p_min=0.0, tree_nodes=tree,
                                     rollback=rollback), grammar=grammar)


def emitted(events) -> list[int]:
    events = list(events)
    errors = [e.message for e in events if isinstance(e, ErrorEvent)]
    assert not errors, errors
    return [t for e in events for t in e.emitted]


def strict_run(engine, prompt, p) -> tuple[list[int], list]:
    with strict_devices():
        events = list(engine.generate(prompt, p))
    return emitted(events), events


def test_the_guard_catches_a_tensor_made_without_its_device():
    model_side = torch.ones(3, device="cpu")
    with strict_devices():
        with pytest.raises((DeviceMixError, RuntimeError)):
            float((model_side + torch.tensor([1.0])).sum())
        with pytest.raises(DeviceMixError):  # a CPU generator drawing on another device
            torch.multinomial(torch.ones(3, device="meta"), 1, generator=torch.Generator(device="cpu"))
        assert float((model_side + torch.tensor([1.0], device="cpu")).sum()) == 6.0


@pytest.mark.parametrize("types,temp,tree,rollback", [
    ([], 0.0, 0, "auto"),  # plain greedy
    (NGRAM_CHAIN, 0.0, 0, "auto"),  # the n-gram chain
    (NGRAM_CHAIN, 0.0, 12, "auto"),  # trees
    (NGRAM_CHAIN, 0.0, 0, "checkpoint"),  # the checkpoint path: restore and replay
    ([], 0.8, 0, "auto"),  # sampling
    (["draft-simple"], 0.8, 0, "auto"),  # rejection sampling with the draft model's q
])
def test_the_engine_makes_every_tensor_on_the_models_device(engine, types, temp, tree, rollback):
    got, events = strict_run(engine, PROMPT, params(types, temp, tree, rollback))
    assert got == emitted(engine.generate(PROMPT, params(types, temp, tree, rollback)))  # the same, unguarded
    if not any(e.verify_mode == "rejection" for e in events):  # matching: plain decoding's tokens too
        assert got == emitted(engine.generate(PROMPT, params([], temp)))
    if types:
        assert any(e.kind == "spec" for e in events), "no draft was verified: the guard saw no speculation"


def test_two_slots_in_one_round(engine):
    p = params(NGRAM_CHAIN, 0.0, 12)
    with strict_devices():
        slots = [engine.start(prompt, p) for prompt in (PROMPT, OTHER)]
        events = []
        while any(s.state != "done" for s in slots):
            events.extend(engine.step())
    emitted(events)
    for slot, prompt in zip(slots, (PROMPT, OTHER)):
        assert list(slot.generated) == emitted(engine.generate(prompt, params()))
    assert any(e.n_seqs == 2 for e in events if hasattr(e, "n_seqs"))


def test_the_draft_head(models, tmp_path):
    path = tmp_path / "head.safetensors"
    save_head(tiny_head(models[0], train_steps=0), path)
    with strict_devices():
        eng = card_path(Engine(models[0], n_ctx=256, n_seq_max=2, calibrate=False,
                               drafter_params={"draft-head": DraftHeadParams(weights=path, p_min=0.0)}))
    for temp in (0.0, 0.8):
        got, events = strict_run(eng, PROMPT, params(["draft-head"], temp))
        assert got == emitted(eng.generate(PROMPT, params(["draft-head"], temp)))
        assert any(e.drafter == "draft-head" for e in events)


@pytest.fixture(scope="module")
def grammar_engine():
    target = random_model("embedded", small=True)
    with strict_devices():
        return card_path(Engine(target, n_ctx=256, n_seq_max=2, calibrate=False)), target


fresh_engines = forgetting("engine", "grammar_engine")


@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_a_grammar(grammar_engine, temp):
    eng, target = grammar_engine
    ids = target.encode("a b c a b c a b c")
    p = params(["grammar"] + NGRAM_CHAIN, temp, n=16, grammar=GrammarSpec("regex", "[a-z]{3,8}: [0-9]{2,4}"))
    got, _ = strict_run(eng, ids, p)
    p.spec.types = []
    assert got == emitted(eng.generate(ids, p))
    assert target.decode(got).split(":")[0].isalpha()


def test_the_device_flag_is_read_and_checked():
    assert resolve_device("cpu") == "cpu" and pick_device(None) == "cpu"  # no flag: never a card
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="--device must be"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA device"):
            load_model("embedded", device="cuda:0")
    synchronize("cpu")  # free, and no error, on the CPU
