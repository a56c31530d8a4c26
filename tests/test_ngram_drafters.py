"""The n-gram drafters on hand-built token lists: what they propose, caps, per-sequence state, resets."""

from __future__ import annotations

import random
import time

import pytest

from engine.draft.base import DraftRequest
from engine.draft.ngram import NgramMapK, NgramMapK4V, NgramMapParams, NgramSimple, NgramSimpleParams
from engine.draft.ngram_cache import NgramCache, NgramCacheParams, load_cache, save_cache, update_cache
from engine.draft.ngram_mod import NgramMod, NgramModParams

BASE = list(range(100, 120))  # 20 distinct tokens
FILLER = list(range(500, 540))  # 40 more, never repeated


def req(prompt, id_last, seq=0, n_max=16, n_min=0):
    return DraftRequest(seq=seq, prompt=list(prompt), id_last=id_last, n_max=n_max, n_min=n_min, p_min=0.0)


def run(drafter, prompt, id_last, **kw):
    r = req(prompt, id_last, **kw)
    drafter.draft([r])
    assert r.drafting, "draft() must leave the baton to the chain"
    assert r.result_q is None
    return r.result


def make(name):
    """Each drafter with small sizes so that short hand-built lists repeat enough."""
    if name == "ngram-simple":
        return NgramSimple(NgramSimpleParams(size_n=3, size_m=4))
    if name == "ngram-map-k":
        return NgramMapK(NgramMapParams(size_n=3, size_m=4))
    if name == "ngram-map-k4v":
        return NgramMapK4V(NgramMapParams(size_n=3, size_m=4))
    if name == "ngram-mod":
        return NgramMod(NgramModParams(n_match=3, n_max=4, n_min=1, pool_size=1 << 16))
    return NgramCache(NgramCacheParams(n_draft=4))


ALL = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]
# BASE, then FILLER, then BASE again up to BASE[5]: the continuation of the repeat is BASE[6:]
REPEAT = BASE + FILLER + BASE[:5]


def started(name, prompt, seq=0):
    d = make(name)
    d.begin(seq, list(prompt))
    return d


# ---- behaviour shared by all five


@pytest.mark.parametrize("name", ALL)
def test_repeated_pattern_yields_continuation(name):
    d = started(name, REPEAT)
    assert run(d, REPEAT, BASE[5]) == BASE[6:10]
    assert d.name == name


@pytest.mark.parametrize("name", ALL)
def test_n_max_caps(name):
    d = started(name, REPEAT)
    assert run(d, REPEAT, BASE[5], n_max=2) == BASE[6:8]
    assert run(d, REPEAT, BASE[5], n_max=0) == []


@pytest.mark.parametrize("name", ALL)
def test_n_min_drops_short_drafts(name):
    d = started(name, REPEAT)
    assert run(d, REPEAT, BASE[5], n_min=4) == BASE[6:10]
    assert run(d, REPEAT, BASE[5], n_min=5) == []


@pytest.mark.parametrize("name", ALL)
def test_no_repetition_no_draft(name):
    prompt = BASE + FILLER
    d = started(name, prompt)
    assert run(d, prompt, 999) == []
    assert run(d, prompt + [999], 998) == []


@pytest.mark.parametrize("name", ALL)
def test_sequences_are_independent(name):
    d = make(name)
    other = FILLER + list(range(700, 720))  # no BASE token at all
    d.begin(0, REPEAT)
    d.begin(1, other)
    r0, r1 = req(REPEAT, BASE[5], seq=0), req(other[:-2] + BASE[3:5], BASE[5], seq=1)
    d.draft([r0, r1])
    assert r0.result == BASE[6:10]
    assert r1.result == []  # seq 1 never saw what follows BASE[3:6]


@pytest.mark.parametrize("name", ["ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"])
def test_seq_rm_forgets(name):
    d = started(name, REPEAT, seq=3)
    run(d, REPEAT, BASE[5], seq=3)
    assert 3 in d._seqs
    d.seq_rm(3)
    assert 3 not in d._seqs
    d.seq_rm(3)  # twice is harmless


def test_simple_is_stateless():
    d = started("ngram-simple", REPEAT)
    assert not hasattr(d, "_seqs")
    assert run(d, REPEAT, BASE[5]) == BASE[6:10]


@pytest.mark.parametrize("name", ALL)
def test_drafts_only_confirmed_tokens(name):
    rng = random.Random(7)
    for trial in range(20):
        prompt = [rng.randrange(12) for _ in range(150)]
        d = started(name, prompt, seq=trial)
        for _ in range(30):
            id_last = rng.randrange(12)
            history = set(prompt) | {id_last}
            assert set(run(d, prompt, id_last, seq=trial)) <= history
            prompt = prompt + [id_last] + [rng.randrange(12) for _ in range(rng.randrange(3))]


@pytest.mark.parametrize("name", ALL)
def test_incremental_history_is_used(name):
    # the repeat only appears in tokens confirmed after begin(); mod indexes them once > 32 are pending
    d = started(name, BASE)
    prompt = BASE + FILLER + BASE[:5]
    assert run(d, prompt, BASE[5]) == BASE[6:10]


@pytest.mark.parametrize("name", ALL)
def test_draft_is_fast_on_long_history(name):
    rng = random.Random(1)
    drafter = {
        "ngram-simple": NgramSimple(), "ngram-map-k": NgramMapK(), "ngram-map-k4v": NgramMapK4V(),
        "ngram-mod": NgramMod(NgramModParams()), "ngram-cache": NgramCache(),
    }[name]
    chunk = [rng.randrange(2000) for _ in range(300)]
    stream = [rng.randrange(2000) for _ in range(1000)] + chunk * 11  # 4300 tokens, much repetition
    drafter.begin(0, stream[:4000])
    requests = [req(stream[: 4000 + i], stream[4000 + i]) for i in range(200)]  # one token confirmed per round
    t0 = time.perf_counter()
    for r in requests:
        drafter.draft([r])
    per_call = (time.perf_counter() - t0) / len(requests)
    assert sum(len(r.result) > 0 for r in requests) > 150
    assert per_call < 1e-3, f"{name}: {per_call * 1e6:.0f} us per draft()"


@pytest.mark.parametrize("name", ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache"])
def test_replaced_history_is_reindexed(name):
    # the same seq, no begin(), a shorter history with other content (e.g. after a rollback): no stale draft
    d = started(name, REPEAT + [42, 43])
    assert run(d, REPEAT + [42, 43], 44) == []
    other = FILLER[:7] + BASE[:3] + [7, 8, 9, 10, 11] + FILLER[7:] + BASE[:2]
    assert run(d, other, BASE[2]) == [7, 8, 9, 10]


# ---- ngram-simple


def test_simple_takes_latest_occurrence():
    d = make("ngram-simple")
    prompt = BASE[:3] + [1, 2, 3, 4] + FILLER + BASE[:3] + [5, 6, 7, 8] + FILLER[:10] + BASE[:2]
    assert run(d, prompt, BASE[2]) == [5, 6, 7, 8]


def test_simple_needs_n_tokens_after_match():
    # llama.cpp: fewer than size_n tokens after the latest match -> no draft, even if older matches exist
    d = make("ngram-simple")
    loop = [1, 2, 3]
    prompt = FILLER + loop * 5 + [1, 2]
    assert run(d, prompt, 3) == []


def test_simple_falls_back_to_shorter_keys():
    # the answer changed one token of the text it copies (BASE[3] -> 777): the 3-token key ends in 777 and has no
    # earlier occurrence; with size_n_min = 1 the 1-token key BASE[4] finds the source again
    prompt = BASE + FILLER + BASE[:3] + [777]
    llama = NgramSimple(NgramSimpleParams(size_n=3, size_m=4))
    assert run(llama, prompt, BASE[4]) == []
    ours = NgramSimple(NgramSimpleParams(size_n=3, size_m=4, size_n_min=1))
    assert run(ours, prompt, BASE[4]) == BASE[5:9]
    # a 2-token key wins over a 1-token one: BASE[4] also occurs before 999 later, 777 BASE[4] only once
    prompt2 = BASE + FILLER + [777, BASE[4], 1, 2, 3, 4] + [999, BASE[4], 5, 6, 7, 8] + FILLER[:5] + [777]
    assert run(ours, prompt2, BASE[4]) == [1, 2, 3, 4]
    assert run(NgramSimple(NgramSimpleParams(size_n=3, size_m=4, size_n_min=2)), prompt, BASE[4]) == []


# ---- ngram-map-k / k4v


def test_map_k_min_hits():
    d = NgramMapK(NgramMapParams(size_n=3, size_m=4, min_hits=2))
    d.begin(0, REPEAT)
    assert run(d, REPEAT, BASE[5]) == []  # the key occurred once
    twice = BASE + FILLER + BASE + FILLER[:10] + BASE[:5]
    assert run(d, twice, BASE[5]) == BASE[6:10]


def test_map_k_length_follows_last_acceptance():
    d = started("ngram-map-k", REPEAT)
    assert run(d, REPEAT, BASE[5]) == BASE[6:10]
    d.accept(0, 2, is_other=False)
    assert run(d, REPEAT, BASE[5]) == BASE[6:8]
    d.accept(0, 1, is_other=True)  # someone else's draft: ignored
    assert run(d, REPEAT, BASE[5]) == BASE[6:8]


K4V_KEY = [1, 2, 3]
A, B = [10, 11, 12, 13], [20, 21, 22, 23]


def k4v_history(values):
    out = list(FILLER[:5])
    for i, v in enumerate(values):
        out += K4V_KEY + v + [600 + i]
    return out + K4V_KEY[:2]


def test_k4v_picks_most_frequent_value():
    prompt = k4v_history([A, A, A, B])  # B is the latest continuation
    assert run(started("ngram-map-k", prompt), prompt, 3) == B
    assert run(started("ngram-map-k4v", prompt), prompt, 3) == A


def test_k4v_no_draft_without_a_dominant_value():
    prompt = k4v_history([A, B, A, B])
    assert run(started("ngram-map-k4v", prompt), prompt, 3) == []
    prompt = k4v_history([A, B, A, A])  # 3 >= 2 * 1
    assert run(started("ngram-map-k4v", prompt), prompt, 3) == A


def test_k4v_min_hits():
    d = NgramMapK4V(NgramMapParams(size_n=3, size_m=4, min_hits=3))
    prompt = k4v_history([A, A])
    d.begin(0, prompt)
    assert run(d, prompt, 3) == []
    prompt = k4v_history([A, A, A])
    assert run(d, prompt, 3) == A


# ---- ngram-mod


def mod(**kw):
    params = dict(n_match=3, n_max=4, n_min=1, pool_size=1 << 16) | kw
    return NgramMod(NgramModParams(**params))


def test_mod_pool_n_min_counts_lookups():
    # the chain runs d, x, a, b and then misses: 4 tokens
    prompt = FILLER[:20] + [1, 2, 3, 4, 9] + [1, 2]
    d = mod(n_max=6, n_min=4)
    d.begin(0, prompt)
    assert run(d, prompt, 3) == [4, 9, 1, 2]
    d = mod(n_max=6, n_min=5)
    d.begin(0, prompt)
    assert run(d, prompt, 3) == []


def test_mod_occupancy_reset_in_begin():
    d = mod(pool_size=64)
    d.begin(0, BASE + FILLER)  # 57 windows in 64 slots
    assert d.pool_used(0) == 0
    d = mod(pool_size=1024)
    d.begin(0, BASE + FILLER)
    assert 0 < d.pool_used(0) < 0.25 * 1024


def low_rounds(d, k, is_other=False):
    for _ in range(k):
        assert run(d, REPEAT, BASE[5]) == BASE[6:10]
        d.accept(0, 0, is_other=is_other)


def test_mod_low_acceptance_resets_after_five_rounds():
    d = started("ngram-mod", REPEAT)
    low_rounds(d, 4)
    assert d.pool_used(0) > 0
    low_rounds(d, 1)
    assert d.pool_used(0) == 0


def test_mod_low_acceptance_streak_breaks_and_ignores_other():
    d = started("ngram-mod", REPEAT)
    low_rounds(d, 4)
    run(d, REPEAT, BASE[5])
    d.accept(0, 1, is_other=False)  # 1/4 is not low: the streak restarts
    low_rounds(d, 4)
    for _ in range(5):
        d.accept(0, 0, is_other=True)  # the draft of another drafter
    assert d.pool_used(0) > 0


def test_mod_catches_up_in_chunks():
    d = mod()
    d.begin(0, FILLER)
    short = FILLER + BASE[:10] + BASE[:2]  # 12 new tokens: not indexed yet
    assert run(d, short, BASE[2]) == []
    longer = FILLER + BASE + list(range(800, 820)) + BASE[:2]  # 42 new tokens: indexed
    assert run(d, longer, BASE[2]) == BASE[3:7]


def test_mod_begin_forgets_the_previous_prompt():
    d = started("ngram-mod", REPEAT)
    d.begin(0, FILLER)
    assert run(d, FILLER + BASE[3:5], BASE[5]) == []


def test_mod_shared_pool_is_llama_cpp_behaviour():
    d = mod(shared_pool=True)
    d.begin(0, REPEAT)
    d.begin(1, FILLER)
    assert run(d, FILLER + BASE[3:5], BASE[5], seq=1) == BASE[6:10]  # learnt from seq 0


# ---- ngram-cache


def test_cache_lax_thresholds():
    d = started("ngram-cache", [])
    assert run(d, FILLER[:5] + [5, 9, 1, 2, 3], 5) == []  # 5 -> 9 seen once: a 1-gram needs 2 samples
    d = started("ngram-cache", [])
    assert run(d, FILLER[:5] + [5, 9, 1, 5, 9, 2], 5)[:1] == [9]


def test_cache_counts_ngrams_across_rounds():
    # 4 follows 1 2 3 only as an id_last; llama.cpp counts each round's chunk alone and would miss it
    prompt = FILLER[:10] + [1, 2, 3]
    d = started("ngram-cache", prompt)
    run(d, prompt, 4)
    prompt = prompt + [4] + FILLER[10:20] + [1, 2]
    assert run(d, prompt, 3) == [4] + FILLER[10:13]


def test_cache_static_cache_drafts_and_file_round_trip(tmp_path):
    static = {}
    update_cache(static, [7, 8, 9] * 3, 9, 2, 2)
    path = tmp_path / "static.bin"
    save_cache(static, path)
    assert load_cache(path) == static
    d = NgramCache(NgramCacheParams(n_draft=4, lookup_cache_static=str(path)))
    d.begin(0, FILLER)
    assert run(d, FILLER + [7], 8) == [9, 7, 8, 9]

