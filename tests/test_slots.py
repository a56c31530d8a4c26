"""Slots as llama-server runs them: output limits per forward, a shared prompt stored once (seq_cp), synthetic
acceptance, and bad input about capacity. The lossless slot tests live in test_engine.py and test_embedded.py."""

import pytest

from engine.batch import output_limits
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from fresh import forgetting
from test_engine import PROMPTS, SMALL_NGRAMS, tokens
from tiny import suite_dtype

SYSTEM = [1, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42]  # a "system prompt" both chats start with


@pytest.fixture(scope="module")
def engine(tiny_target):
    return Engine(tiny_target, n_ctx=512, n_seq_max=3, drafter_params=SMALL_NGRAMS, calibrate=False)


fresh_engines = forgetting("engine")


def params(types=("ngram-simple",), n=30, temp=0.0, seed=0, **spec):
    spec = {"n_max": 6, "adaptive": False, "p_min": 0.0, **spec}
    return GenParams(max_new_tokens=n, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                     spec=SpecParams(types=list(types), **spec))


def alone(engine, prompt, p):
    out = tokens(engine.generate(prompt, p, seq=0))
    engine.release(0)
    return out


def test_output_limits_follow_llama_cpp():
    assert (output_limits(512, 4, 16).total, output_limits(512, 4, 16).per_seq) == (68, 17)
    assert (output_limits(8, 4, 16).total, output_limits(8, 4, 16).per_seq) == (8, 8)
    assert output_limits(512, 2, 0).total == 2


def test_drafts_shrink_to_the_output_limit_and_stay_lossless(tiny_target):
    """A context that reserves 1 + 2 logits rows per slot: drafts of n_max 6 are cut to 2, never refused."""
    e = Engine(tiny_target, n_ctx=256, n_seq_max=2, drafter_params=SMALL_NGRAMS, calibrate=False, n_draft=2)
    assert e.ctx.n_outputs_max == 6
    want = [alone(e, p, params(types=())) for p in PROMPTS[:2]]
    for seq, prompt in enumerate(PROMPTS[:2]):  # the synthetic drafter always offers n_max tokens
        e.start(prompt, params(types=("ngram-simple", "synthetic")), seq=seq)
    got, rows = {0: [], 1: []}, []
    while e.active():
        for ev in e.step():
            got[ev.seq].extend(ev.emitted)
            assert len(ev.drafted) <= 2
            if ev.kind != "prefill":
                rows.append(ev.batch_rows)
    assert [got[0], got[1]] == want
    assert max(rows) == 6, "both slots should have filled their reserved rows at least once"


def test_a_shared_system_prompt_is_stored_once(engine):
    a, b = SYSTEM + [5, 6, 7, 8, 5, 6], SYSTEM + [10, 11, 12, 13, 10]
    want_b = alone(engine, b, params(temp=0.7, seed=3))
    s0 = engine.start(a, params(n=40), seq=0)
    engine.step()  # slot 0 prefilled: the system prompt is in the cache under seq 0
    s1 = engine.start(b, params(temp=0.7, seed=3), seq=1)
    assert len(s1.tokens) == len(SYSTEM)  # taken from slot 0's cells, not recomputed
    cells = engine.ctx.cache.cell_seq
    assert int((cells[:, 0] & cells[:, 1]).sum()) == len(SYSTEM)
    got = []
    while s1.state != "done":
        got += [t for ev in engine.step() if ev.seq == 1 for t in ev.emitted]
    assert got == want_b
    while s0.state != "done":
        engine.step()
    assert s0.generated == alone(engine, a, params(n=40))
    engine.release(0)
    assert int(cells[:, 1].sum()) == len(s1.tokens)  # slot 1 keeps the shared cells after slot 0 leaves
    engine.release(1)
    assert engine.ctx.cache.n_used() == 0


@pytest.mark.parametrize("p_accept", [0.0, 0.5, 1.0])
def test_synthetic_acceptance_keeps_each_draft_token_with_probability_p(engine, p_accept):
    p = params(types=("synthetic",), n=200, synthetic_accept=p_accept, n_max=4)
    events = list(engine.generate(PROMPTS[1], p, seq=0))
    engine.release(0)
    spec = [ev for ev in events if ev.kind == "spec"]
    assert spec and all(ev.verify_mode == "synthetic" for ev in spec)
    # per position: kept given all before were kept, so the rate is P whatever the draft says
    tried = sum(min(ev.n_accepted + 1, len(ev.drafted)) for ev in spec)
    kept = sum(ev.n_accepted for ev in spec)
    assert abs(kept / tried - p_accept) < 0.1
    if p_accept == 0.0:
        assert tokens(events) == alone(engine, PROMPTS[1], params(types=(), n=200))


def test_synthetic_rates_per_position_keep_exactly_their_share(engine):
    """Rates (1, 1, 0): the first two draft tokens always kept, the third never, whatever the drafts say."""
    p = params(types=("synthetic",), n=60, synthetic_accept=(1.0, 1.0, 0.0), n_max=4)
    events = list(engine.generate(PROMPTS[1], p, seq=0))
    engine.release(0)
    spec = [ev for ev in events if ev.kind == "spec" and len(ev.drafted) >= 3]
    assert spec and all(ev.n_accepted == 2 for ev in spec)
    with pytest.raises(ValueError, match="synthetic_accept"):
        params(types=("synthetic",), synthetic_accept=(0.5, 1.5)).validate()


def test_more_slots_than_the_cache_holds_is_refused(tiny_target):
    with pytest.raises(ValueError, match="cannot hold 4 slots"):
        Engine(tiny_target, n_ctx=128, n_seq_max=4, calibrate=False)


def test_a_full_cache_refuses_a_new_prompt_and_loses_nothing(tiny_target):
    e = Engine(tiny_target, n_ctx=128, n_seq_max=2, calibrate=False)
    first = e.start(list(range(5, 60)) + list(range(5, 60)), params(types=(), n=5), seq=0)
    e.step()
    used = e.ctx.cache.n_used()
    with pytest.raises(ValueError, match="cache is full"):
        e.start(list(range(6, 60)), params(types=()), seq=1)
    assert e.ctx.cache.n_used() == used and set(e.slots) == {0}
    while first.state != "done":
        e.step()
    assert len(first.generated) == 5


def test_a_slot_stopped_mid_way_leaves_no_draft_cells_and_others_go_on(engine):
    want = alone(engine, PROMPTS[2], params(n=40))
    s0 = engine.start(PROMPTS[0], params(n=60), seq=0)
    s1 = engine.start(PROMPTS[2], params(n=40), seq=1)
    for _ in range(3):
        engine.step()
    engine.stop(0)
    engine.step()
    assert s0.stop_reason == "stopped"
    assert engine.ctx.cache.seq_cells(0).numel() == len(s0.tokens)  # no rejected-draft cells left behind
    engine.release(0)
    assert engine.ctx.cache.seq_cells(0).numel() == 0
    while s1.state != "done":
        engine.step()
    assert s1.generated == want
    engine.release(1)


@pytest.mark.parametrize("by_seq", [True, False])
@pytest.mark.skipif(suite_dtype() != "float32", reason="matches transformers' forward to 1e-4, a float32 property; "
                    "bfloat16 rows are checked bit for bit against our own plain decoding (test_lean.py)")
def test_per_sequence_attention_matches_plain_forwards(tiny_target, by_seq):
    """Three sequences decoded together, twice (prefill, then one row each): every row's logits equal a plain
    forward of its own sequence, whether each sequence's cells form one run (read as a slice) or are scattered
    (the full-mask fallback)."""
    import torch

    from engine.forward.attention import cell_layout
    from engine.batch import Batch
    from engine.memory.context import ModelContext

    ctx = ModelContext(tiny_target.model, n_ctx=192, n_seq_max=3)
    assert ctx.per_seq_attention
    ctx.cache.by_seq = by_seq
    seqs = [PROMPTS[0], PROMPTS[1][:7], PROMPTS[2]]
    batch = Batch()
    for s, toks in enumerate(seqs):
        for i, t in enumerate(toks[:-1]):
            batch.add(t, i, s, True)
    first = ctx.decode(batch).logits
    batch2 = Batch()
    for s, toks in enumerate(seqs):
        batch2.add(toks[-1], len(toks) - 1, s, True)
    mask = ctx.cache.prepare(batch2)
    layout = cell_layout(mask, ctx.cache.cell_pos[: mask.shape[-1]])
    ctx.cache.rollback_claim()
    assert layout.one_run_per_row() == by_seq
    last = ctx.decode(batch2).logits
    row = 0
    for s, toks in enumerate(seqs):
        with torch.inference_mode():
            plain = tiny_target.model(input_ids=torch.tensor([toks])).logits[0]
        assert torch.allclose(first[row:row + len(toks) - 1], plain[:-1], atol=1e-4)
        assert torch.allclose(last[s], plain[-1], atol=1e-4)
        row += len(toks) - 1
