"""Round-level defects: a shared batch that must fit the free cells, a draft vocabulary of another width,
the drafters' state on the checkpoint path, per-sequence durations, and an n_max above the draft capacity."""

from dataclasses import replace

import pytest
import torch

from engine.round import verify
from engine.draft.synthetic import SyntheticDrafter
from engine.load.models import load_model
from engine.params import GenParams, SpecParams
from engine.forward.prepack import prepack_linears
from engine.sampling import Sampler, SamplerParams
from engine.serve.engine import Engine
from fresh import forgetting
from test_engine import PROMPTS, SMALL_NGRAMS, tokens
from tiny import WORDS, suite_dtype


def spec_params(types, n=40, n_max=6, temp=0.0, seed=0, rollback="auto"):
    return GenParams(max_new_tokens=n, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                     spec=SpecParams(types=list(types), n_max=n_max, adaptive=False, p_min=0.0, rollback=rollback))


@pytest.fixture(scope="module")
def roomy(tiny_target):
    """An engine with room to spare: the reference for plain decoding."""
    return Engine(tiny_target, n_ctx=1024, n_seq_max=2, calibrate=False, drafter_params=SMALL_NGRAMS)


@pytest.fixture(scope="module")
def one_slot(tiny_target):
    """One slot, short n-grams: built once for the tests that need nothing else (a build runs its load check)."""
    return Engine(tiny_target, n_ctx=256, n_seq_max=1, calibrate=False, drafter_params=SMALL_NGRAMS)


fresh_engines = forgetting("roomy", "one_slot")


def plain(engine, prompt, n, temp=0.0, seed=0):
    events = list(engine.generate(prompt, spec_params([], n=n, temp=temp, seed=seed), seq=0))
    engine.release(0)
    return tokens(events)


# ---- the shared batch fits the free cells ---------------------------------------------------------------


def test_drafts_of_several_slots_are_trimmed_to_fit_the_free_cells(tiny_target, roomy):
    engine = Engine(tiny_target, n_ctx=128, n_seq_max=2, calibrate=False)
    forwards = []  # (rows, free cells) of every forward of the target
    decode = engine.ctx.decode

    def checked_decode(batch):
        free = engine.ctx.n_ctx - engine.ctx.cache.n_used()
        forwards.append((len(batch), free))
        assert len(batch) <= free, f"a batch of {len(batch)} rows for {free} free cells"
        return decode(batch)

    engine.ctx.decode = checked_decode
    prompts = [PROMPTS[0] * 3, PROMPTS[1] * 3]
    # the synthetic drafter always offers n_max tokens: every round asks for all the room there is
    slots = [engine.start(p, spec_params(["synthetic"], n=100, n_max=16), seq=i) for i, p in enumerate(prompts)]
    while engine.active():
        engine.step()
    for slot in slots:
        assert slot.stop_reason == "context"
        assert slot.generated == plain(roomy, slot.prompt, len(slot.generated))
    assert engine.ctx.cache.n_used() >= engine.ctx.n_ctx - 1, "the slots should have used the cache up"
    untrimmed = 2 * (1 + 16)  # both slots' sampled rows and full drafts
    assert any(free < untrimmed and rows > 2 for rows, free in forwards), "the cache was never tight"


# ---- a draft vocabulary narrower or wider than the target's -------------------------------------------------


P_LOGITS = torch.tensor([2.0, 1.5, 0.2, -1.0, 0.7, 0.0, 1.1, -0.4, 0.9, 0.3, -2.0, 1.3])  # the target's V = 12


def draft_q(width: int) -> torch.Tensor:
    """A draft that likes the wrong tokens; when wider than the target, 40% of it on ids the target lacks."""
    g = torch.Generator().manual_seed(width)
    q = torch.rand(width, generator=g) ** 3
    q = q / q.sum()
    if width > len(P_LOGITS):
        q[:len(P_LOGITS)] *= 0.6 / float(q[:len(P_LOGITS)].sum())
        q[len(P_LOGITS):] *= 0.4 / float(q[len(P_LOGITS):].sum())
    return q


@pytest.mark.parametrize("width", [len(P_LOGITS) - 5, len(P_LOGITS) + 7])
def test_rejection_sampling_with_a_draft_vocabulary_of_another_width_gives_p(width):
    vocab = len(P_LOGITS)
    q = draft_q(width)
    target = Sampler(SamplerParams(temp=1.0, seed=7))
    p = target.probs(P_LOGITS)
    g = torch.Generator().manual_seed(99)
    logits = torch.stack([P_LOGITS, P_LOGITS])
    counts = torch.zeros(vocab)
    n = 8000
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=g))
        v = verify.rejection(target, logits, [d], [q])
        assert all(0 <= t < vocab for t in v.tokens), f"emitted {v.tokens}: the target has {vocab} ids"
        assert v.p_draft_rows == [float(p[d]) if d < vocab else 0.0]
        counts[v.tokens[0]] += 1
    freq = counts / n
    tv = 0.5 * float((freq - p).abs().sum())
    assert tv < 0.03, f"total variation {tv:.3f} between emitted tokens and p"
    q_on_target = torch.zeros(vocab)
    q_on_target[:min(width, vocab)] = q[:vocab]
    assert 0.5 * float((freq - q_on_target / q_on_target.sum()).abs().sum()) > 0.2, "q alone should be far off"


def test_greedy_verification_rejects_a_draft_id_the_target_lacks():
    vocab = len(P_LOGITS)
    logits = torch.stack([P_LOGITS, P_LOGITS])
    v = verify.rejection(Sampler(SamplerParams(temp=0.0)), logits, [vocab + 3], [draft_q(vocab + 7)])
    assert v.tokens == [int(P_LOGITS.argmax())] and v.n_accepted == 0 and v.p_draft_rows == [0.0]


def with_output_width(draft, width: int):
    """The draft with logits `width` wide: its first ids keep their head rows, extra ids get logits so low that
    they never reach the draft's top k (the target could not take them as input)."""
    old = draft.model.lm_head.weight
    n = min(width, old.shape[0])
    head = torch.nn.Linear(old.shape[1], width, bias=True, dtype=old.dtype)
    with torch.no_grad():
        head.weight.zero_()
        head.weight[:n] = old[:n]
        head.bias.zero_()
        head.bias[n:] = -1e4
    draft.model.lm_head = head
    prepack_linears(draft.model)  # as the loader would have
    return draft


@pytest.mark.parametrize("width", [len(WORDS) - 5, len(WORDS) + 7])
def test_a_draft_model_of_another_output_width_verifies_by_rejection_sampling(tiny_target, tiny_dirs, width):
    stock = load_model(str(tiny_dirs["draft"]), device="cpu", dtype=suite_dtype(), prepack=False)
    draft = with_output_width(stock, width)
    engine = Engine(tiny_target, draft=draft, n_ctx=256, n_seq_max=1, calibrate=False)
    events = list(engine.generate(PROMPTS[0], spec_params(["draft-simple"], n=30, temp=1.0, seed=3), seq=0))
    spec = [e for e in events if e.kind == "spec"]
    assert spec and all(e.verify_mode == "rejection" for e in spec)
    assert len(tokens(events)) == 30 and all(0 <= t < len(WORDS) for t in tokens(events))


# ---- the drafters on the checkpoint path ----------------------------------------------------------------


class RecordingDrafter(SyntheticDrafter):
    """Full-length drafts of recent context (rejections guaranteed) that remember their last draft per sequence
    and record which draft they held at each accept(), so a checkpoint that put the drafters back before
    accept() would show here."""

    def __init__(self):
        self.last_draft: dict[int, list[int]] = {}
        self.heard: list[tuple[list[int], int]] = []  # (draft held, n_accepted) per accept as the winner

    def draft(self, requests):
        super().draft(requests)
        for r in requests:
            self.last_draft[r.seq] = list(r.result)

    def accept(self, seq, n_accepted, is_other):
        if not is_other:
            self.heard.append((list(self.last_draft.get(seq, [])), n_accepted))


@pytest.mark.parametrize("rollback", ["auto", "checkpoint"])
@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_a_drafter_hears_accept_while_it_holds_the_draft_it_made(tiny_target, roomy, rollback, temp):
    engine = Engine(tiny_target, n_ctx=256, n_seq_max=1, calibrate=False)
    recorder = RecordingDrafter()
    engine.chain.add("synthetic", recorder)
    n_checkpoint = 0
    for seed, prompt in enumerate(PROMPTS):
        recorder.heard.clear()
        events = list(engine.generate(prompt, spec_params(["synthetic"], temp=temp, seed=seed, rollback=rollback),
                                      seq=0))
        engine.release(0)
        assert tokens(events) == plain(roomy, prompt, 40, temp=temp, seed=seed)
        spec = [e for e in events if e.kind == "spec"]
        assert recorder.heard == [(e.drafted, e.n_accepted) for e in spec]
        n_checkpoint += sum(e.rollback == "checkpoint" for e in spec)
    assert (n_checkpoint > 0) == (rollback == "checkpoint")


def ngram_state(engine, name: str, seq: int):
    """What an n-gram drafter keeps between rounds for a sequence, besides its index of the confirmed tokens."""
    drafter = engine.pool[name]
    state = drafter._seqs[seq]
    if name == "ngram-mod":
        return replace(state), drafter.pool_used(seq)
    return dict(state.n_accepted), state.last_used


def state_after_first_partial_round(engine, prompt, name, rollback, temp):
    slot = engine.start(prompt, spec_params([name], n=60, temp=temp, rollback=rollback), seq=0)
    try:
        while slot.state != "done":
            for ev in engine.step():
                if ev.kind == "spec" and ev.n_accepted < len(ev.drafted):
                    return ev.rollback, ev.drafted, ev.n_accepted, ngram_state(engine, name, 0)
        return None
    finally:
        engine.release(0)


@pytest.mark.parametrize("name", ["ngram-map-k", "ngram-map-k4v", "ngram-mod"])
@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_ngram_state_after_a_checkpoint_round_equals_the_range_removal_path(one_slot, name, temp):
    engine = one_slot
    prompts = PROMPTS + [[1, 5, 6, 7, 5, 6, 8, 5, 6, 7, 5, 6, 9, 5, 6, 7, 5, 6]]
    n_compared = 0
    for prompt in prompts:
        by_range = state_after_first_partial_round(engine, prompt, name, "auto", temp)
        by_checkpoint = state_after_first_partial_round(engine, prompt, name, "checkpoint", temp)
        if by_range is None:
            assert by_checkpoint is None
            continue
        assert by_range[0] == "seq_rm" and by_checkpoint[0] == "checkpoint"
        assert by_checkpoint[1:] == by_range[1:]
        n_compared += 1
    assert n_compared > 0, f"{name} never had a partial acceptance: nothing was compared"


# ---- per-sequence counters ---------------------------------------------------------------------------


def test_per_sequence_counters_record_the_durations_of_the_global_ones(one_slot):
    engine = one_slot  # its global counters start at zero (the reset), as the sequence's do
    events = list(engine.generate(PROMPTS[0], spec_params(["ngram-simple", "synthetic"], n=30), seq=0))
    assert any(e.kind == "spec" for e in events)
    per_seq = engine.chain.seq_stats[0]
    assert set(per_seq) == set(engine.chain.stats) == {"ngram-simple", "synthetic"}
    for name, mine in per_seq.items():
        every = engine.chain.stats[name]
        assert mine.t_draft_us > 0, f"{name}: no draft duration for the sequence"
        for attr in ("t_begin_us", "t_draft_us", "t_accept_us"):
            assert getattr(mine, attr) == pytest.approx(getattr(every, attr)), f"{name}.{attr}"
        for attr in ("n_call_begin", "n_call_draft", "n_call_accept", "n_gen_tokens", "n_acc_tokens"):
            assert getattr(mine, attr) == getattr(every, attr), f"{name}.{attr}"
    assert per_seq["synthetic"].n_call_accept > 0 and per_seq["synthetic"].t_accept_us > 0


def test_per_sequence_draft_durations_add_up_to_the_global_one(tiny_target):
    engine = Engine(tiny_target, n_ctx=256, n_seq_max=2, calibrate=False)
    for seq, prompt in enumerate(PROMPTS[:2]):
        engine.start(prompt, spec_params(["synthetic"], n=20), seq=seq)
    while engine.active():
        engine.step()
    total = engine.chain.stats["synthetic"]
    per_seq = [engine.chain.seq_stats[seq]["synthetic"] for seq in (0, 1)]
    assert all(s.t_draft_us > 0 and s.t_accept_us > 0 for s in per_seq)
    assert sum(s.t_draft_us for s in per_seq) == pytest.approx(total.t_draft_us)
    assert sum(s.t_accept_us for s in per_seq) == pytest.approx(total.t_accept_us)


# ---- n_max above the draft capacity ---------------------------------------------------------------------


@pytest.mark.parametrize("n_draft,n_max,effective", [(16, 32, 16), (16, 8, 8), (4, 16, 4), (16, 16, 16)])
def test_an_n_max_above_the_draft_capacity_is_shown_on_the_slot(tiny_target, n_draft, n_max, effective):
    engine = Engine(tiny_target, n_ctx=256, n_seq_max=1, calibrate=False, n_draft=n_draft)
    slot = engine.start(PROMPTS[0], spec_params(["synthetic"], n=60, n_max=n_max), seq=0)
    assert slot.n_max_effective == effective
    if n_max > effective:
        assert slot.notes == [f"n_max {n_max} is above this engine's draft capacity of {effective}: "
                              f"drafts are capped at {effective}"]
    else:
        assert slot.notes == []
    drafted = []
    while slot.state != "done":
        drafted += [len(e.drafted) for e in engine.step() if e.kind == "spec"]
    assert max(drafted) == effective  # the synthetic drafter offers n_max: what is verified is the effective value


def test_plain_decoding_has_no_draft_capacity_note(tiny_target):
    engine = Engine(tiny_target, n_ctx=256, n_seq_max=1, calibrate=False)
    slot = engine.start(PROMPTS[0], spec_params([], n=5, n_max=64), seq=0)
    assert slot.n_max_effective == 0 and slot.notes == []


# ---- idle slots give their cells to the generating ones ------------------------------------------------


def test_a_running_answer_takes_the_cells_a_finished_slot_keeps(tiny_target, roomy):
    """A finished slot keeps its cells for prefix reuse; when a generating slot needs them, they are given up
    instead of the answer stopping early with 'context'."""
    engine = Engine(tiny_target, n_ctx=256, n_seq_max=2, calibrate=False)
    done = list(engine.generate(PROMPTS[0], spec_params([], n=150), seq=0))
    assert done[-1].stop_reason == "length" and engine.ctx.cache.n_used() > 150
    events = list(engine.generate(PROMPTS[1], spec_params(["ngram-simple"], n=150), seq=1))
    assert events[-1].stop_reason == "length"
    assert tokens(events) == plain(roomy, PROMPTS[1], 150)
