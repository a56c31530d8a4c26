"""Prompts longer than a forward's rows: prefilled chunk by chunk between the other slots' rounds, token-identical
to plain decoding, on tiny models and on the embedded model with real documents of 600 to 3000 tokens
(assets/prompts/long.jsonl: a summary, retrieval passages, a service log, an extraction)."""

import json
import math
import time
from pathlib import Path

import pytest
import torch

from engine.draft.registry import NGRAM_CHAIN
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from engine.serve.prefill import N_BATCH, N_BATCH_BESIDE
from fresh import forgetting
from test_engine import SMALL_NGRAMS

LONG = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "long.jsonl"


def params(n: int, types=(), temp: float = 0.0) -> GenParams:
    return GenParams(max_new_tokens=n, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=3),
                     spec=SpecParams(types=list(types), n_max=6))


def tiny_prompt(n: int, seed: int = 0) -> list[int]:
    """n tokens of the tiny vocabulary, phrases repeating as a document's do (the n-grams find them)."""
    g = torch.Generator().manual_seed(seed)
    phrases = [torch.randint(5, 64, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(24)]
    out = [1]
    while len(out) < n:
        out += phrases[int(torch.randint(0, len(phrases), (1,), generator=g))]
    return out[:n]


def run(engine: Engine, prompt: list[int], p: GenParams, seq: int = 0) -> list[int]:
    out = [t for ev in engine.generate(prompt, p, seq=seq) for t in ev.emitted]
    engine.release(seq)
    return out


@pytest.fixture(scope="module")
def tiny_engine(tiny_target):
    return Engine(tiny_target, n_ctx=2048, n_seq_max=2, calibrate=False, drafter_params=SMALL_NGRAMS)


fresh_engines = forgetting("tiny_engine")


@pytest.mark.parametrize("n", [N_BATCH - 1, N_BATCH + 1, 900])
def test_a_prompt_past_one_forward_is_prefilled_in_chunks_and_lossless(tiny_engine, tiny_target, n):
    """The chunk that holds no output row (every one but the last) asks the LM head for no row; the answer is
    generate()'s, speculative or not."""
    prompt = tiny_prompt(n)
    plain = run(tiny_engine, prompt, params(24))
    assert run(tiny_engine, prompt, params(24, NGRAM_CHAIN)) == plain
    want, step, cache = [], torch.tensor([prompt]), None
    with torch.inference_mode():  # transformers' own forward over the whole prompt at once, then greedy
        for _ in range(24):
            res = tiny_target.model(step, past_key_values=cache, use_cache=True)
            cache, tok = res.past_key_values, int(res.logits[0, -1].argmax())
            want.append(tok)
            step = torch.tensor([[tok]])
    assert plain == want


def test_a_long_prefill_runs_between_the_other_slots_rounds(tiny_engine):
    """While a 900-token prompt prefills, the slot already answering gets a round in every step, and the long
    one takes ceil(900 / N_BATCH_BESIDE) steps; its answer is the one it gets alone."""
    short, long = tiny_prompt(20, seed=1), tiny_prompt(900, seed=2)
    alone = run(tiny_engine, long, params(16, NGRAM_CHAIN), seq=1)
    a = tiny_engine.start(short, params(400, NGRAM_CHAIN), seq=0)
    tiny_engine.step()
    b = tiny_engine.start(long, params(16, NGRAM_CHAIN), seq=1)
    steps = 0
    while b.state == "prefill":
        events = tiny_engine.step()
        steps += 1
        assert any(ev.seq == 0 and ev.emitted for ev in events), "the answering slot waited for the prefill"
    assert steps == math.ceil(900 / N_BATCH_BESIDE)
    tiny_engine.stop(0)
    while b.state != "done" or a.state != "done":
        tiny_engine.step()
    assert b.generated == alone
    tiny_engine.release(0)
    tiny_engine.release(1)


def test_prompts_prefilling_together_share_one_allowance_of_rows(tiny_target):
    """Two long prompts arriving while a slot answers: each step forwards N_BATCH_BESIDE prompt rows in all,
    not that many per prompt, so the answering slot's wait does not grow with the prompts in line; both
    answers are the ones they get alone."""
    engine = Engine(tiny_target, n_ctx=4096, n_seq_max=3, calibrate=False, drafter_params=SMALL_NGRAMS)
    short, longs = tiny_prompt(20, seed=5), [tiny_prompt(500, seed=6), tiny_prompt(300, seed=7)]
    alone = [run(engine, p, params(8, NGRAM_CHAIN), seq=i + 1) for i, p in enumerate(longs)]
    a = engine.start(short, params(400, NGRAM_CHAIN), seq=0)
    engine.step()
    waiting = [engine.start(p, params(8, NGRAM_CHAIN), seq=i + 1) for i, p in enumerate(longs)]
    steps = 0
    while any(s.state == "prefill" for s in waiting):
        before = sum(s.prefill_rows for s in waiting)
        events = engine.step()
        steps += 1
        assert sum(s.prefill_rows for s in waiting) - before <= N_BATCH_BESIDE
        assert any(ev.seq == 0 and ev.emitted for ev in events), "the answering slot waited for the prefills"
    assert steps == math.ceil(800 / N_BATCH_BESIDE)
    engine.stop(0)
    while any(s.state != "done" for s in [a, *waiting]):
        engine.step()
    assert [s.generated for s in waiting] == alone


def test_step_mode_prefills_a_long_prompt_in_one_step(tiny_engine):
    prompt = tiny_prompt(900, seed=4)
    slot = tiny_engine.start(prompt, params(4), seq=0)
    events = tiny_engine.step({0}, whole_prefill=True)
    assert [ev.kind for ev in events] == ["prefill"] and events[0].batch_rows == 900 and slot.state == "generating"
    tiny_engine.release(0)


@pytest.fixture(scope="module")
def documents(embedded):
    return {row["id"]: embedded.encode_chat(row["messages"]) for row in map(json.loads, LONG.open())}


def test_the_documents_are_as_long_as_they_say(documents):
    sizes = {name: len(ids) for name, ids in documents.items()}
    assert 580 <= sizes["summary-600"] <= 600 and 1450 <= sizes["rag-1500"] <= 1500
    assert 2900 <= sizes["log-3000"] <= 3000


def test_long_documents_on_the_embedded_model_are_lossless_and_never_stall_the_others(embedded, documents):
    """600, 1500 and 3000 tokens of real text: speculative answers token for token the plain ones, and a
    chat answering beside each prefill never waits much longer than one chunk for its next round."""
    engine = Engine(embedded, n_ctx=4096, n_seq_max=2, calibrate=False)
    chat = embedded.encode_chat([{"role": "user", "content": "Tell a long story about a lighthouse."}])
    for name in ("summary-600", "rag-1500", "log-3000"):
        ids = documents[name]
        plain = run(engine, ids, params(32), seq=1)
        beside = engine.start(chat, params(2000, NGRAM_CHAIN), seq=0)
        engine.step()
        slot = engine.start(ids, params(32, NGRAM_CHAIN), seq=1)
        gaps, last = [], time.perf_counter()
        while slot.state != "done":
            events = engine.step()
            now = time.perf_counter()
            if any(ev.seq == 0 for ev in events):
                gaps.append(now - last)
                last = now
        assert slot.generated == plain, name
        # a chunk's cost grows with the context it attends to and with the host: the bound is the chunks' own
        # mean (a stall would be the whole prefill, ceil(n / N_BATCH_BESIDE) chunks long)
        chunk_s = slot.prefill_ms / 1e3 / math.ceil(len(ids) / N_BATCH_BESIDE)
        assert max(gaps) < 2.5 * chunk_s, f"{name}: the other chat waited {max(gaps):.2f} s (a chunk {chunk_s:.2f} s)"
        engine.stop(0)
        while beside.state != "done":
            engine.step()
        engine.release(0)
        engine.release(1)
