"""The real embedded model (SmolLM2-135M-Instruct, Q4_1 GGUF dequantised): lossless over varied prompts."""

import json
from pathlib import Path

import pytest
import torch

from engine.draft.registry import NGRAM_CHAIN
from engine.params import GenParams, SpecParams
from engine.serve.engine import Engine
from fresh import forgetting
from tiny import suite_dtype

PROMPTS = [json.loads(line) for line in
           (Path(__file__).parent.parent / "assets" / "prompts" / "all.jsonl").read_text().splitlines()]
N_NEW = 48


@pytest.fixture(scope="module")
def engine(embedded):
    return Engine(embedded, n_ctx=2048, n_seq_max=2)


fresh_engines = forgetting("engine")


@pytest.fixture(scope="module")
def prompt_ids(embedded):
    return [embedded.encode_chat(p["messages"]) for p in PROMPTS]


@pytest.fixture(scope="module")
def plain(engine, prompt_ids):
    return [generate(engine, ids, []) for ids in prompt_ids]


def generate(engine, ids, types, adaptive=True):
    params = GenParams(max_new_tokens=N_NEW, spec=SpecParams(types=types, adaptive=adaptive))
    return [t for ev in engine.generate(ids, params) for t in ev.emitted]


def test_prompts_are_varied():
    kinds = {p["kind"] for p in PROMPTS}
    assert len(PROMPTS) >= 8 and kinds == {"copy", "open"}


def test_probe_and_memory(engine):
    assert engine.probe.kind == "PART"
    cost = engine.cost  # measured at start; with prepacked linears 2-8 rows may cost what one row costs
    assert cost.c(1) == 1.0 and min(cost.seconds) > 0 and cost.sizes[-1] >= 8
    assert cost.seconds == sorted(cost.seconds)  # a bigger batch never looks cheaper to the length policy


@pytest.mark.skipif(suite_dtype() != "float32", reason="transformers' bfloat16 forward rounds otherwise: other "
                    "greedy text; the bench's match_plain column shows how far they agree")
def test_plain_decoding_equals_transformers_generate(engine, prompt_ids, plain):
    model = engine.target.model
    for ids, ours in zip(prompt_ids, plain):
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=N_NEW, do_sample=False,
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        assert out[0, len(ids):].tolist() == ours


@pytest.mark.parametrize("types", [[t] for t in NGRAM_CHAIN] + [NGRAM_CHAIN])
def test_speculation_is_token_identical_on_the_real_model(engine, prompt_ids, plain, types):
    n_spec = 0
    for ids, want in zip(prompt_ids, plain):
        params = GenParams(max_new_tokens=N_NEW, spec=SpecParams(types=types, adaptive=False))
        events = list(engine.generate(ids, params))
        assert [t for ev in events for t in ev.emitted] == want
        n_spec += sum(ev.kind == "spec" for ev in events)
    assert n_spec > 0, f"{types} never drafted on {len(PROMPTS)} prompts"


def test_chain_with_adaptive_length_is_lossless(engine, prompt_ids, plain):
    for ids, want in zip(prompt_ids, plain):
        assert generate(engine, ids, NGRAM_CHAIN, adaptive=True) == want


def test_draft_model_drafter_is_token_identical_on_the_real_model(embedded, prompt_ids, plain):
    """draft-simple with the embedded model as its own draft (the only same-vocabulary model offline)."""
    engine = Engine(embedded, draft=embedded, n_ctx=2048, n_seq_max=1, calibrate=False)
    n_acc = 0
    for ids, want in zip(prompt_ids, plain):
        params = GenParams(max_new_tokens=N_NEW, spec=SpecParams(types=["draft-simple"], n_max=4, adaptive=False))
        events = list(engine.generate(ids, params))
        assert [t for ev in events for t in ev.emitted] == want
        n_acc += sum(ev.n_accepted for ev in events)
    assert n_acc > 0


def test_slots_joining_and_leaving_equal_running_alone(engine, prompt_ids):
    """Two chats on the real model, one joining mid-way, at temp 0 and with sample-and-match at temp 0.8."""
    from engine.sampling import SamplerParams

    def params(temp, seed):
        return GenParams(max_new_tokens=32, sampling=SamplerParams(temp=temp, seed=seed),
                         spec=SpecParams(types=NGRAM_CHAIN, adaptive=False))

    jobs = [(prompt_ids[0], params(0.0, 0)), (prompt_ids[-1], params(0.8, 7))]
    alone = []
    for ids, p in jobs:
        alone.append([t for ev in engine.generate(ids, p, seq=0) for t in ev.emitted])
        engine.release(0)
    first = engine.start(jobs[0][0], jobs[0][1], seq=0)
    second = None
    shared = 0
    while engine.active():
        evs = engine.step()
        shared += len(evs) > 1
        if second is None and len(first.generated) >= 8:
            second = engine.start(jobs[1][0], jobs[1][1], seq=1)
    assert [first.generated, second.generated] == alone
    assert shared > 0, "the two slots never ran in the same round"
    engine.release(0)
    engine.release(1)
    assert engine.ctx.cache.n_used() == 0
