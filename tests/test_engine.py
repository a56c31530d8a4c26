"""The round loop on tiny models: lossless at temp 0 and with sample-and-match, slots, bad input."""

import pytest
import torch

from engine.draft.registry import NGRAM_CHAIN
from engine.draft.ngram import NgramMapParams, NgramSimpleParams
from engine.draft.ngram_mod import NgramModParams
from engine.load.models import ModelLoadError, load_model
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from fresh import forgetting
from tiny import load_tiny, suite_dtype

# short n-grams: a tiny model's text is short and loops, so long keys would never match
SMALL_NGRAMS = {
    "ngram-simple": NgramSimpleParams(size_n=2, size_m=8),
    "ngram-map-k": NgramMapParams(size_n=2, size_m=8),
    "ngram-map-k4v": NgramMapParams(size_n=2, size_m=8),
    "ngram-mod": NgramModParams(n_match=3, n_max=8, n_min=1, pool_size=1 << 12),
}
PROMPTS = [
    [1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6],
    [1, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
    [1, 40, 41, 40, 41, 40, 42, 43, 40, 41],
]


def tokens(events) -> list[int]:
    return [t for e in events for t in e.emitted]


def run(engine, prompt, types, temp=0.0, seed=0, n=40, adaptive=False, n_max=6, p_min=0.0):
    params = GenParams(max_new_tokens=n, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                       spec=SpecParams(types=list(types), n_max=n_max, adaptive=adaptive, p_min=p_min))
    return list(engine.generate(prompt, params))


@pytest.fixture(scope="module")
def engine(tiny_target, tiny_draft):
    return Engine(tiny_target, draft=tiny_draft, n_ctx=512, n_seq_max=4, drafter_params=SMALL_NGRAMS)


@pytest.fixture(scope="module")
def self_draft_engine(tiny_target):
    return Engine(tiny_target, draft=tiny_target, n_ctx=512, n_seq_max=2)


fresh_engines = forgetting("engine", "self_draft_engine")


def hf_greedy(model, prompt, n):
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None,
                             pad_token_id=3, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("types", [[t] for t in NGRAM_CHAIN] + [NGRAM_CHAIN, ["draft-simple"],
                                                                NGRAM_CHAIN + ["draft-simple"]])
def test_greedy_speculation_is_token_identical_to_plain_and_hf(engine, tiny_target, types):
    n_spec = 0
    for prompt in PROMPTS:
        plain = tokens(run(engine, prompt, []))
        events = run(engine, prompt, types)
        assert tokens(events) == plain
        if suite_dtype() == "float32":  # transformers' forward rounds otherwise in bfloat16: other greedy text
            assert plain == hf_greedy(tiny_target.model, prompt, 40)
        n_spec += sum(e.kind == "spec" for e in events)
    assert n_spec > 0, "no draft was ever verified: the test would not test speculation"


@pytest.mark.parametrize("tree_nodes", [0, 8])
def test_explained_events_carry_the_targets_entropy_at_each_emitted_token(engine, tiny_target, tree_nodes):
    """GenParams.explain: each emitted token's entropy is the target's softmax entropy at the row that chose it,
    the same as a plain forward over the whole text gives there (chains, trees, the prefill's first token)."""
    prompt = PROMPTS[0]
    params = GenParams(max_new_tokens=24, ignore_eos=True, explain=True,
                       spec=SpecParams(types=["ngram-simple", "draft-simple"], n_max=4, adaptive=False, p_min=0.0,
                                       tree_nodes=tree_nodes))
    events = list(engine.generate(prompt, params))
    assert any(e.n_accepted for e in events), "no draft kept: the accepted rows would go untested"
    text = tokens(events)
    with torch.inference_mode():
        logp = torch.log_softmax(tiny_target.model(torch.tensor([prompt + text])).logits[0].float(), dim=-1)
    want = (-(logp.exp() * logp).sum(-1) / torch.log(torch.tensor(2.0)))[len(prompt) - 1:-1]
    got = [h for e in events for h in e.entropy]
    assert len(got) == len(text)
    tol = 1e-3 if suite_dtype() == "float32" else 0.05
    assert torch.allclose(torch.tensor(got), want, atol=tol)
    assert all(e.entropy == [] for e in run(engine, prompt, ["draft-simple"], n=8))  # off by default


def test_partial_acceptances_happen_and_cut_the_cache(engine):
    events = run(engine, PROMPTS[0], ["draft-simple"], n=60)
    partial = [e for e in events if e.kind == "spec" and e.n_accepted < len(e.drafted)]
    assert partial, "the tiny draft model should be wrong sometimes"
    for e in partial:
        assert e.rollback == "seq_rm" and e.rm_range == (e.p0 + e.n_accepted, e.p0 + len(e.drafted))


def test_a_draft_equal_to_the_target_is_always_accepted(self_draft_engine):
    events = run(self_draft_engine, PROMPTS[1], ["draft-simple"], n=30)
    spec = [e for e in events if e.kind == "spec"]
    assert spec and all(e.n_accepted == len(e.drafted) for e in spec)


@pytest.mark.parametrize("types", [["ngram-simple"], NGRAM_CHAIN])
def test_sample_and_match_gives_plain_sampling_text_for_the_same_seed(engine, types):
    for seed in (1, 2, 3):
        plain = tokens(run(engine, PROMPTS[0], [], temp=0.9, seed=seed))
        events = run(engine, PROMPTS[0], types, temp=0.9, seed=seed)
        assert tokens(events) == plain
        assert all(e.verify_mode == "match" for e in events if e.kind == "spec")


def test_rejection_sampling_is_used_with_a_draft_model_at_temp(engine):
    events = run(engine, PROMPTS[0], ["draft-simple"], temp=1.0, seed=4, n=30)
    spec = [e for e in events if e.kind == "spec"]
    assert spec and all(e.verify_mode == "rejection" for e in spec)
    assert all(e.q_draft is not None and len(e.q_draft) == len(e.drafted) for e in spec)


def exact_second_token_distribution(model, prompt, temp):
    """P(t2) = sum over t1 of p(t1 | prompt) p(t2 | prompt, t1), computed with 64 plain forwards."""
    with torch.inference_mode():
        p1 = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1] / temp, -1)
        rows = torch.tensor([prompt + [t] for t in range(p1.shape[0])])
        p2 = torch.softmax(model(input_ids=rows).logits[:, -1] / temp, -1)
    return (p1[:, None] * p2).sum(0)


def test_rejection_sampling_matches_the_target_distribution_end_to_end(engine, tiny_target):
    """Second generated token over many seeds: rejection sampling against the exact target distribution."""
    prompt, temp, n = PROMPTS[1], 1.0, 400
    exact = exact_second_token_distribution(tiny_target.model, prompt, temp)
    plain, spec = torch.zeros_like(exact), torch.zeros_like(exact)
    draft_only = torch.zeros_like(exact)
    for seed in range(n):
        plain[tokens(run(engine, prompt, [], temp=temp, seed=seed, n=2))[1]] += 1
        events = run(engine, prompt, ["draft-simple"], temp=temp, seed=10_000 + seed, n=3, n_max=1)
        spec[tokens(events)[1]] += 1
        if events[1].drafted:
            draft_only[events[1].drafted[0]] += 1
    tv_plain = 0.5 * float((plain / n - exact).abs().sum())
    tv_spec = 0.5 * float((spec / n - exact).abs().sum())
    tv_draft = 0.5 * float((draft_only / draft_only.sum() - exact).abs().sum())
    assert tv_spec < tv_plain + 0.06, f"speculative {tv_spec:.3f} vs plain sampling noise {tv_plain:.3f}"
    assert tv_draft > tv_spec + 0.1, "the draft alone should be visibly off, or this test proves nothing"


@pytest.mark.parametrize("types", [[], ["draft-simple"], NGRAM_CHAIN])
def test_a_temperature_below_1e_5_answers_as_greedy(engine, types):
    """logits / 1e-40 overflows to inf and softmax to NaN: such a temperature must decode as temperature 0."""
    for prompt in PROMPTS:
        greedy = tokens(run(engine, prompt, types, seed=5))
        for temp in (1e-40, 9e-6):
            events = run(engine, prompt, types, temp=temp, seed=5)
            assert tokens(events) == greedy
            assert all(e.verify_mode != "rejection" for e in events if e.kind == "spec")
    params = SamplerParams(temp=0.7)
    params.temp = 1e-40
    assert params.temp == 0.0 and SamplerParams(temp=1e-5).temp == 1e-5


def test_adaptive_policy_still_lossless(engine):
    for prompt in PROMPTS:
        assert tokens(run(engine, prompt, NGRAM_CHAIN, adaptive=True)) == tokens(run(engine, prompt, []))


def test_slots_in_one_forward_equal_running_alone(engine):
    alone = [tokens(run(engine, p, ["draft-simple"] if i % 2 else ["ngram-simple"])) for i, p in enumerate(PROMPTS)]
    params = [GenParams(max_new_tokens=40, ignore_eos=True,
                        spec=SpecParams(types=["draft-simple"] if i % 2 else ["ngram-simple"], n_max=6,
                                        adaptive=False, p_min=0.0)) for i in range(3)]
    for seq in list(engine.slots):
        engine.release(seq)
    got = {0: [], 1: [], 2: []}
    s0 = engine.start(PROMPTS[0], params[0], seq=0)
    s1 = engine.start(PROMPTS[1], params[1], seq=1)
    rows = []
    joined = False
    while engine.active():
        evs = engine.step()
        rows.extend(e.batch_rows for e in evs if e.kind != "prefill")
        for e in evs:
            got[{s0.seq: 0, s1.seq: 1, 2: 2}[e.seq]].extend(e.emitted)
        if not joined and len(got[0]) > 10:  # a third slot joins mid-way
            engine.start(PROMPTS[2], params[2], seq=2)
            joined = True
    assert [got[0], got[1], got[2]] == alone
    assert max(rows) > 2, "slots were never verified in a shared forward"
    for seq in range(3):
        engine.release(seq)
    assert engine.ctx.cache.n_used() == 0


def test_stop_mid_generation_frees_nothing_else(engine):
    params = GenParams(max_new_tokens=50, ignore_eos=True, spec=SpecParams(types=["ngram-simple"]))
    engine.start(PROMPTS[0], params, seq=0)
    other = engine.start(PROMPTS[1], GenParams(max_new_tokens=20, ignore_eos=True), seq=1)
    engine.step()
    engine.step()
    engine.stop(0)
    events = engine.step()
    assert any(e.seq == 0 and e.stop_reason == "stopped" for e in events)
    while engine.active():
        engine.step()
    assert len(other.generated) == 20
    assert other.generated == tokens(run(engine, PROMPTS[1], [], n=20))
    engine.release(0)
    engine.release(1)


def test_prefix_of_previous_turn_is_reused(engine):
    first = run(engine, PROMPTS[0], [], n=10)
    prompt2 = PROMPTS[0] + tokens(first) + [20, 21]
    slot_tokens_before = list(engine.slots[0].tokens)
    slot = engine.start(prompt2, GenParams(max_new_tokens=10, ignore_eos=True), seq=0)
    assert len(slot.tokens) == len(slot_tokens_before) > 0  # kept in the cache, not recomputed
    got = []
    while slot.state != "done":
        got += [t for e in engine.step() for t in e.emitted]
    engine.release(0)
    assert got == tokens(run(engine, prompt2, [], n=10))


def test_an_engine_that_forgets_its_learning_is_a_fresh_engine(tiny_target, tiny_draft):
    def build():
        return Engine(tiny_target, draft=tiny_draft, n_ctx=512, n_seq_max=2, calibrate=False,
                      drafter_params=SMALL_NGRAMS)

    used, fresh = build(), build()
    params = GenParams(max_new_tokens=24, ignore_eos=True,
                       spec=SpecParams(types=NGRAM_CHAIN + ["draft-simple"], tree_nodes=8))
    for seq, prompt in enumerate(PROMPTS[:2]):  # two slots: the gate learns what drafting pays beside another
        used.start(prompt, params, seq=seq)
    while used.active():
        used.step()
    used.start(PROMPTS[2], params, seq=0)
    used.step()  # an answer under way, its cells in the cache
    assert used.budget.gate.by_crowd and used.cost.seen and used.chain.stats
    used.forget_learning()
    assert used.budget.gate == fresh.budget.gate and used.budget.state == fresh.budget.state
    assert used.cost == fresh.cost and not used.budget.records and not used.chain.stats
    assert not used.slots and not used.pool and used.ctx.cache.n_used() == 0
    assert used.budget.policy.cost is used.cost and used.round.budget is used.budget
    # and it serves as before, through the objects the round and the relay hold
    plain = tokens(run(fresh, PROMPTS[2], []))
    assert tokens(run(used, PROMPTS[2], NGRAM_CHAIN + ["draft-simple"], adaptive=True)) == plain


@pytest.mark.parametrize("make,match", [
    (lambda e: e.start([], GenParams()), "empty prompt"),
    (lambda e: e.start(list(range(5, 60)) * 10, GenParams()), "does not fit the context"),
    (lambda e: e.start([1, 5], GenParams(spec=SpecParams(types=["ngram-simple"], n_min=5, n_max=2))),
     "n_min"),
    (lambda e: e.start([1, 5], GenParams(spec=SpecParams(types=["ngram-bogus"]))), "unknown drafter"),
    (lambda e: e.start([1, 5], GenParams(max_new_tokens=0)), "max_new_tokens"),
    # a tokenizer's BatchEncoding (a dict) or text instead of ids, an id outside the vocabulary
    (lambda e: e.start({"input_ids": [1, 5], "attention_mask": [1, 1]}, GenParams()), "list of token ids"),
    (lambda e: e.start("hello", GenParams()), "list of token ids"),
    (lambda e: e.start([1, 5.0], GenParams()), "holding float"),
    (lambda e: e.start([1, 64], GenParams()), r"ids must be in \[0, 64\)"),
    (lambda e: e.start([1, 5], GenParams(spec=SpecParams(tree_nodes=-1))), "tree_nodes"),
])
def test_bad_input_is_refused_and_changes_nothing(engine, make, match):
    used = engine.ctx.cache.n_used()
    with pytest.raises(ValueError, match=match):
        make(engine)
    assert engine.ctx.cache.n_used() == used and not engine.active()


def test_draft_simple_without_a_draft_model_is_refused(tiny_target):
    e = Engine(tiny_target, n_ctx=64, n_seq_max=1, calibrate=False)
    with pytest.raises(ValueError, match="needs a draft model"):
        e.start([1, 5, 6], GenParams(spec=SpecParams(types=["draft-simple"])))


def test_draft_with_another_vocabulary_drafts_only_through_text(tiny_target, tiny_dirs):
    other = load_tiny(tiny_dirs["other_vocab"])
    e = Engine(tiny_target, draft=other, n_ctx=64, n_seq_max=1, calibrate=False)
    assert "token 5 differs" in e.draft_mismatch and e.draft_type == "draft-uni"
    with pytest.raises(ValueError, match="target's vocabulary.*token 5 differs.*use draft-uni"):
        e.start([1, 5, 6], GenParams(spec=SpecParams(types=["draft-simple"])))


@pytest.mark.parametrize("name,match", [("/no/such/model", "not found"), ("missing.gguf", "not found"),
                                        ("", "no model")])
def test_models_that_do_not_load_give_one_line(name, match):
    with pytest.raises(ModelLoadError, match=match) as err:
        load_model(name)
    assert "\n" not in str(err.value)


def test_hub_id_without_network_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="cannot load model"):
        load_model("some-org/some-model-that-is-not-cached")


def test_probe_reports_part_for_llama(engine):
    assert engine.probe.kind == "PART"


@pytest.mark.parametrize("types,temp", [(["ngram-simple"], 0.0), (["draft-simple"], 0.0), (NGRAM_CHAIN, 0.8),
                                        (["ngram-simple", "draft-simple"], 0.8)])
def test_forced_checkpoint_rollback_is_identical_to_range_removal(engine, types, temp):
    """The FULL path (checkpoint, restore, replay) on a model that could cut the tail: same text, more work."""
    n_replays = 0
    for seed, prompt in enumerate(PROMPTS):
        want = tokens(run(engine, prompt, [], temp=temp, seed=seed, n=50))
        params = GenParams(max_new_tokens=50, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                           spec=SpecParams(types=types, n_max=6, adaptive=False, p_min=0.0, rollback="checkpoint"))
        if temp > 0 and "draft-simple" in types:
            params.spec.types = [t for t in types if t != "draft-simple"]  # rejection sampling draws differently
        events = list(engine.generate(prompt, params))
        assert tokens(events) == want
        replays = [e for e in events if e.kind == "replay"]
        n_replays += len(replays)
        for e in events:
            if e.kind == "spec" and e.n_accepted < len(e.drafted) and not e.done:
                assert e.rollback == "checkpoint" and e.rm_range == (e.pos_sampled, e.p0 + len(e.drafted))
        assert engine.ctx.cache.seq_pos_max(events[-1].seq) == len(engine.slots[events[-1].seq].tokens) - 1
    assert n_replays > 0, "no partial acceptance: the checkpoint path was never taken"
