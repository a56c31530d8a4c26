"""Structured output with speculation: a grammar masks the target's sampler, and speculative decoding gives
exactly what constrained plain decoding gives (the embedded model: the tiny test tokenizer has no decoder that
llguidance can read, and JSON needs real subword tokens)."""

import json
import time

import pytest
import torch

from engine.round import verify
from engine.draft.registry import NGRAM_CHAIN
from engine.grammar import Grammar, GrammarSpec
from engine.params import GenParams, SpecParams
from engine.sampling import Sampler, SamplerParams
from engine.serve.engine import Engine
from engine.serve.grammars import GrammarCache
from fresh import forgetting
from grammar_prompts import CASES, check, messages, schema_text

N_NEW = 64  # every CASES answer is complete well within this (checked below)
CHAIN = ["grammar"] + NGRAM_CHAIN


@pytest.fixture(scope="module")
def engine(embedded):
    # one slot per prompt: every run decodes all CASES together, one batched forward per round
    return Engine(embedded, n_ctx=2048, n_seq_max=len(CASES), calibrate=False)


fresh_engines = forgetting("engine")


@pytest.fixture(scope="module")
def prompts(embedded):
    return [embedded.encode_chat(messages(c)) for c in CASES]


def params(case, types=(), temp=0.0, seed=0, adaptive=False, rollback="auto") -> GenParams:
    return GenParams(max_new_tokens=N_NEW, sampling=SamplerParams(temp=temp, seed=seed),
                     spec=SpecParams(types=list(types), adaptive=adaptive, rollback=rollback),
                     grammar=GrammarSpec("json_schema", schema_text(case)))


def run(engine, ids, p) -> tuple[list[int], list]:
    events = list(engine.generate(ids, p))
    return [t for ev in events for t in ev.emitted], events


def run_all(engine, prompts, make) -> tuple[list[list[int]], list]:
    """Every case at once, each in its own slot: (emitted tokens per case, all events)."""
    slots = [engine.start(ids, make(i, case)) for i, (case, ids) in enumerate(zip(CASES, prompts))]
    events = []
    while any(s.state != "done" for s in slots):
        events.extend(engine.step())
    return [list(s.generated) for s in slots], events


@pytest.fixture(scope="module")
def plain(engine, prompts):
    return run_all(engine, prompts, lambda i, c: params(c))[0]


def test_constrained_plain_answers_parse_and_follow_their_schema(embedded, plain):
    for case, toks in zip(CASES, plain):
        assert toks[-1] in embedded.eos_ids(), "the answer must end when the grammar is complete"
        check(json.loads(embedded.decode(toks)), case[2])


def test_constrained_plain_equals_a_reference_loop(engine, embedded, prompts, plain):
    """The engine's constrained plain decoding against a loop of full forwards masked by a fresh matcher."""
    for case, ids, want in list(zip(CASES, prompts, plain))[:2]:
        g = Grammar.start(GrammarSpec("json_schema", schema_text(case)), engine.grammar_tokenizer())
        out, step, cache = [], torch.tensor([ids]), None
        with torch.inference_mode():
            while len(out) < N_NEW:
                res = embedded.model(step, past_key_values=cache, use_cache=True)
                cache = res.past_key_values
                tok = int(g.mask(res.logits[0, -1]).argmax())
                g.consume(tok)
                out.append(tok)
                step = torch.tensor([[tok]])
                if tok in engine.eos:
                    break
        assert out == want


@pytest.mark.parametrize("types", [[t] for t in NGRAM_CHAIN] + [["grammar"], CHAIN], ids=lambda t: "+".join(t))
def test_constrained_speculation_is_token_identical_at_temp_0(engine, prompts, plain, types):
    got, events = run_all(engine, prompts, lambda i, c: params(c, types))
    for case, g, want in zip(CASES, got, plain):
        assert g == want, f"{types} differs on {case[1]!r}"
    # the n-gram drafters find little to copy in answers this short (their keys must recur): they must still
    # be lossless where they do draft; the grammar drafter always has forced keys to offer
    if "grammar" in types or types == ["ngram-simple"]:
        assert any(ev.kind == "spec" for ev in events), f"{types} never drafted"


@pytest.mark.parametrize("types", [["draft-head"], CHAIN + ["draft-head"]], ids=lambda t: "+".join(t))
def test_the_draft_head_under_a_grammar_is_token_identical_at_temp_0(engine, prompts, plain, types):
    got, events = run_all(engine, prompts, lambda i, c: params(c, types))
    assert got == plain
    assert any(ev.kind == "spec" and ev.drafter == "draft-head" for ev in events), "the head never drafted"


def test_rejection_sampling_under_a_grammar_keeps_to_the_schema(engine, embedded, prompts):
    """At temperature > 0 the head's drafts are verified by masked rejection sampling: lossless in distribution
    (test_masked_rejection_sampling_is_distributed_as_masked_p), so here every answer must follow its schema."""
    got, events = run_all(engine, prompts, lambda i, c: params(c, ["draft-head"], temp=0.7, seed=200 + i))
    assert any(ev.verify_mode == "rejection" for ev in events), "no round was verified by rejection sampling"
    for case, toks in zip(CASES, got):
        if toks[-1] in engine.eos:
            check(json.loads(embedded.decode(toks)), case[2])


def test_adaptive_chain_and_checkpoint_path_are_token_identical(engine, prompts, plain):
    assert run_all(engine, prompts, lambda i, c: params(c, CHAIN, adaptive=True))[0] == plain
    got, events = run_all(engine, prompts, lambda i, c: params(c, CHAIN, rollback="checkpoint"))
    assert got == plain
    assert any(ev.kind == "replay" for ev in events)


def test_sample_and_match_same_seed_same_text_at_temp_07(engine, embedded, prompts):
    want, _ = run_all(engine, prompts, lambda i, c: params(c, temp=0.7, seed=100 + i))
    for types in (CHAIN, ["ngram-simple"]):
        assert run_all(engine, prompts, lambda i, c: params(c, types, temp=0.7, seed=100 + i))[0] == want
    for case, toks in zip(CASES, want):
        if toks[-1] in engine.eos:
            check(json.loads(embedded.decode(toks)), case[2])


def test_grammar_drafter_is_credited_in_the_chain_stats(engine, prompts):
    run_all(engine, prompts, lambda i, c: params(c, CHAIN))
    s = engine.chain.stats["grammar"]
    assert s.n_gen_tokens > 0 and s.n_acc_tokens > 0 and s.n_acc_tokens <= s.n_gen_tokens


def test_grammar_state_follows_kept_tokens_through_rejections_and_replays(engine, prompts, monkeypatch):
    """A drafter that offers the forced tokens then a token the grammar allows but the target seldom picks:
    after every round, the slot's matcher must equal a fresh one fed only the emitted tokens."""
    tok = engine.grammar_tokenizer()
    candidates = [int(t) for t in engine.target.encode(' 7 x "z" , } ] true')]

    def adversary(requests):
        for r in requests:
            forced = r.grammar.forced()[: r.n_max]
            pick = next((c for c in candidates if r.grammar.valid_prefix(forced + [c]) == len(forced) + 1), None)
            r.result = forced + ([pick] if pick is not None and len(forced) < r.n_max else [])

    monkeypatch.setattr(engine.drafter("grammar"), "draft", adversary)
    seen = {"rejected": 0, "replay": 0}
    for rollback in ("auto", "checkpoint"):
        slots = [engine.start(ids, params(case, ["grammar"], rollback=rollback))
                 for case, ids in list(zip(CASES, prompts))[:4]]
        while any(s.state != "done" for s in slots):
            for ev in engine.step():
                seen["rejected"] += ev.kind == "spec" and ev.n_accepted < len(ev.drafted)
                seen["replay"] += ev.kind == "replay"
            for slot in slots:
                if slot.state == "done":
                    continue
                kept = list(slot.generated)
                if slot.replay is not None:  # restored to the checkpoint: the replay round takes these again
                    del kept[len(kept) - (len(slot.replay.tokens) - 1):]
                ref = Grammar.start(slot.params.grammar, tok)
                ref.consume_all(kept)
                assert slot.grammar.matcher.compute_bitmask() == ref.matcher.compute_bitmask()
                assert slot.grammar.forced() == ref.forced()
                assert slot.grammar.is_accepting() == ref.is_accepting()
    assert seen["rejected"] > 0 and seen["replay"] > 0, seen


@pytest.mark.parametrize("kind,text,words", [
    ("json_schema", '{"type": "nonsense"}', "invalid JSON schema"),
    ("json_schema", '{"type": "object",', "not valid JSON"),
    ("regex", "a(b", "invalid regex"),
    ("lark", "start: foo", "invalid Lark grammar"),
    ("yaml", "a: 1", "grammar kind"),
])
def test_bad_grammars_raise_one_line_value_errors(kind, text, words):
    """The text's own checks (kind, JSON) in GrammarSpec.validate, llguidance's in its compile (a child
    process of the cache)."""
    with pytest.raises(ValueError, match=words) as e:
        GrammarCache(lambda: None).prepare(GrammarSpec(kind, text))
    assert "\n" not in str(e.value)


def test_engine_refuses_a_regex_no_token_can_start_and_grammar_with_ignore_eos(engine, prompts):
    bad = GenParams(max_new_tokens=8, grammar=GrammarSpec("regex", "[^\\x00-\\U0010FFFF]"))
    with pytest.raises(ValueError, match="no token of this model can start it"):
        engine.start(prompts[0], bad)
    with pytest.raises(ValueError, match="ignore_eos"):
        engine.start(prompts[0], GenParams(ignore_eos=True, grammar=GrammarSpec("json")))
    # a regex answer ends where the regex does
    toks, _ = run(engine, prompts[0], GenParams(max_new_tokens=16, grammar=GrammarSpec("regex", "[0-9]{2}")))
    assert len(engine.target.decode(toks)) == 2 and engine.target.decode(toks).isdigit()


# ---- masked rejection sampling on a tiny vocabulary --------------------------------------------------------

P_LOGITS = torch.tensor([2.0, 1.5, 0.2, -1.0, 0.7, 0.0])
Q = torch.tensor([0.05, 0.05, 0.3, 0.05, 0.5, 0.05])  # the draft likes a token the grammar forbids (2)
ALLOWED = torch.tensor([True, True, False, True, True, False])


def masked_first_tokens(n: int) -> torch.Tensor:
    """The round as the engine runs it: d ~ q; a forbidden d ends the draft (the target samples that row
    alone); an allowed d is verified by rejection sampling against the masked rows."""
    target = Sampler(SamplerParams(temp=1.0, seed=7))
    g = torch.Generator().manual_seed(99)
    logits = torch.stack([P_LOGITS, P_LOGITS])
    allowed = torch.stack([ALLOWED, ALLOWED])
    counts = torch.zeros(len(Q))
    for _ in range(n):
        d = int(torch.multinomial(Q, 1, generator=g))
        if ALLOWED[d]:
            tok = verify.rejection(target, logits, [d], [Q], allowed).tokens[0]
        else:
            tok = verify.sample_and_match(target, logits[:1], [], allowed[:1]).tokens[0]
        counts[tok] += 1
    return counts / n


def masked_p() -> torch.Tensor:
    return torch.softmax(P_LOGITS.masked_fill(~ALLOWED, float("-inf")), dim=-1)


def test_masked_rejection_sampling_is_distributed_as_masked_p():
    freq = masked_first_tokens(10000)
    assert float(freq[~ALLOWED].sum()) == 0.0
    tv = 0.5 * float((freq - masked_p()).abs().sum())
    assert tv < 0.02, f"total variation {tv:.3f} between emitted tokens and the masked p"


def test_masking_q_without_renormalising_would_be_caught(monkeypatch):
    """q * mask without dividing by its mass accepts too often (exact TV 0.058 here); the same check sees it."""
    monkeypatch.setattr(verify, "mask_q", lambda q, allowed: q * allowed.to(q.dtype))
    freq = masked_first_tokens(10000)
    assert 0.5 * float((freq - masked_p()).abs().sum()) > 0.035


@pytest.mark.parametrize("rollback", ["auto", "checkpoint"])
def test_grammar_state_after_a_stop_equals_the_emitted_tokens(engine, prompts, monkeypatch, rollback):
    """Stop lands between rounds, also between a checkpoint restore and its replay: the matcher must then
    hold exactly the tokens the user was given."""
    tok = engine.grammar_tokenizer()
    candidates = [int(t) for t in engine.target.encode(' 7 x "z" , } ] true')]

    def adversary(requests):  # forced tokens then one the target seldom takes: rejections, and replays
        for r in requests:
            forced = r.grammar.forced()[: r.n_max]
            pick = next((c for c in candidates if r.grammar.valid_prefix(forced + [c]) == len(forced) + 1), None)
            r.result = forced + ([pick] if pick is not None and len(forced) < r.n_max else [])

    monkeypatch.setattr(engine.drafter("grammar"), "draft", adversary)
    stopped_in_replay = 0
    for case, ids in list(zip(CASES, prompts))[:4]:
        for n_rounds in (2, 3, 4):
            slot = engine.start(ids, params(case, ["grammar"], rollback=rollback))
            for _ in range(n_rounds):
                if slot.state != "done":
                    engine.step()
            if slot.state == "done":
                continue
            stopped_in_replay += slot.replay is not None
            engine.stop(slot.seq)
            engine.step()
            assert slot.stop_reason == "stopped"
            ref = Grammar.start(slot.params.grammar, tok)
            ref.consume_all(list(slot.generated))
            assert slot.grammar.matcher.compute_bitmask() == ref.matcher.compute_bitmask()
            assert slot.grammar.forced() == ref.forced()
    if rollback == "checkpoint":
        assert stopped_in_replay > 0, "no stop landed between a restore and its replay"


def test_a_draft_model_under_a_grammar_is_lossless(embedded, prompts, plain):
    """draft-simple (the target itself as its draft model: the only one with its tokenizer here): token-identical
    at temperature 0, and at 0.7 its drafts go through masked rejection sampling and answers follow the schema.
    Two cases and short drafts: a draft model as large as the target drafts slowly on these cores."""
    n = 2
    engine = Engine(embedded, embedded, n_ctx=1024, n_seq_max=n, calibrate=False)
    cases = list(zip(CASES, prompts, plain))[:n]

    def run_cases(**kw):
        slots = [engine.start(ids, params(case, ["draft-simple"], **kw)) for case, ids, _ in cases]
        events = []
        while any(s.state != "done" for s in slots):
            events.extend(engine.step())
        return [list(s.generated) for s in slots], events

    got, events = run_cases()
    assert got == [want for _, _, want in cases]
    assert any(ev.kind == "spec" and ev.drafter == "draft-simple" for ev in events)
    got, events = run_cases(temp=0.7, seed=300)
    assert any(ev.verify_mode == "rejection" for ev in events)
    for (case, _, _), toks in zip(cases, got):
        if toks[-1] in engine.eos:
            check(json.loads(embedded.decode(toks)), case[2])


def test_a_rejected_end_of_sequence_rolls_back_to_the_token_before_it(engine, embedded):
    """llguidance keeps no history entry for the end-of-sequence token: rolling back over it must leave the
    matcher right after the tokens before it, where the end is allowed again."""
    g = Grammar.start(GrammarSpec("regex", "ab"), engine.grammar_tokenizer())
    ab = embedded.tokenizer.encode("ab", add_special_tokens=False)
    eos = sorted(engine.eos)[0]
    g.masks_along(ab + [eos], embedded.model.config.vocab_size)  # the draft 'ab', end: the matcher walks it all
    g.rollback(1)  # the end was rejected
    assert g.is_accepting() and bool(g.allowed(embedded.model.config.vocab_size)[eos])
    g.consume(eos)
    g.rollback(len(ab) + 1)
    assert not g.is_accepting() and g.valid_prefix(ab + [eos]) == len(ab) + 1


def test_a_gbnf_grammar_constrains_plain_and_speculative_decoding_alike(engine, embedded):
    """llama.cpp's GBNF, converted by llguidance: the answer keeps to it, with and without speculation."""
    spec = GrammarSpec("gbnf", 'root ::= ("yes" | "no") ", because " [a-z ,]+ "."')
    ids = embedded.encode_chat([{"role": "user", "content": "Is the sea salty? Answer briefly."}])

    def answer(types):
        p = GenParams(max_new_tokens=40, spec=SpecParams(types=types, adaptive=False), grammar=spec)
        return run(engine, ids, p)[0]

    plain = answer([])
    assert answer(CHAIN) == plain
    text = embedded.decode(plain)
    assert text.startswith(("yes, because ", "no, because ")), text
    with pytest.raises(ValueError, match="GBNF"):
        GrammarSpec("gbnf", 'root ::= "unclosed').validate(engine.grammar_tokenizer())


@pytest.mark.parametrize("types", [[], CHAIN])
def test_the_answers_format_verdict_is_the_matchers_on_what_was_emitted(engine, embedded, types):
    """The page's verdict on a regex answer comes from the slot's matcher (never Python's re): cut by the token
    limit inside a round's kept tokens, it is the verdict of a fresh matcher fed exactly the emitted tokens."""
    ids = embedded.encode_chat([{"role": "user", "content": "Describe the sea in one short sentence."}])
    verdicts = []
    for pattern in ("([a-z]+ ?)+\\.", "[A-Za-z ,']+"):
        spec = GrammarSpec("regex", pattern)
        for n in (1, 4, 9, 17):
            p = GenParams(max_new_tokens=n, sampling=SamplerParams(temp=0.0),
                          spec=SpecParams(types=list(types), adaptive=False), grammar=spec)
            toks, events = run(engine, ids, p)
            ref = Grammar.start(spec, engine.grammar_tokenizer())
            ref.consume_all(toks)
            assert events[-1].done and events[-1].format_complete == ref.is_accepting(), (pattern, n)
            verdicts.append(events[-1].format_complete)
    assert set(verdicts) == {True, False}


def test_grammars_past_the_size_or_nesting_limits_are_refused_with_the_reason():
    from engine.grammar import MAX_GRAMMAR_CHARS, MAX_SCHEMA_DEPTH

    deep = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH + 1):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ValueError, match=f"levels deep; at most {MAX_SCHEMA_DEPTH}"):
        GrammarSpec("json_schema", json.dumps(deep)).validate()
    # deeper than Python's own parser goes (llguidance crashed the process on such a schema)
    text = '{"items": ' * 15000 + "{}" + "}" * 15000
    with pytest.raises(ValueError, match="nests deeper than"):
        GrammarSpec("json_schema", text).validate()
    with pytest.raises(ValueError, match=f"at most {MAX_GRAMMAR_CHARS:,}"):
        GrammarSpec("regex", "a" * (MAX_GRAMMAR_CHARS + 1)).validate()


def test_a_grammar_compiles_once_per_message_on_the_callers_thread(embedded, monkeypatch):
    """Scheduler.submit compiles on the caller's thread, within a time limit; the same grammar again (the
    plain comparison of the same message) is not compiled again, and the engine thread only copies it."""
    import threading

    from engine.serve.scheduler import Scheduler

    compiled, threads = [], []
    real = GrammarSpec._compile

    def counting(self):
        compiled.append(self.text)
        threads.append(threading.current_thread().name)
        return real(self)

    monkeypatch.setattr(GrammarSpec, "_compile", counting)
    sched = Scheduler(Engine(embedded, n_ctx=512, n_seq_max=1, calibrate=False))
    try:
        ids = embedded.encode_chat([{"role": "user", "content": "Pick a colour."}])
        for types in (CHAIN, []):
            p = GenParams(max_new_tokens=6, spec=SpecParams(types=list(types)),
                          grammar=GrammarSpec("regex", "(red|green|blue)"))
            gen = sched.submit(ids, p)
            while not gen.events.get(timeout=60).done:
                pass
        assert compiled == ["(red|green|blue)"] and threads == ["grammar-compile"]
        # another client's request: its own compilation (GenParams.client, the cache's partition)
        p = GenParams(max_new_tokens=6, grammar=GrammarSpec("regex", "(red|green|blue)"), client="another")
        gen = sched.submit(ids, p)
        while not gen.events.get(timeout=60).done:
            pass
        assert compiled == ["(red|green|blue)"] * 2
        assert ("another", "regex", "(red|green|blue)") in sched.grammars.compiled

        def slow(self, tokenizer=None):
            time.sleep(2)

        monkeypatch.setattr(GrammarSpec, "validate", slow)
        with pytest.raises(ValueError, match="took over 0 s to compile"):
            GrammarCache(lambda: None).prepare(GrammarSpec("regex", "x"), timeout_s=0.2)
    finally:
        sched.close()


def test_greedy_rows_under_a_grammar_equal_the_masked_argmax_and_mask_only_forbidden_tops(engine, embedded):
    """Greedy verification checks each row's own argmax against the grammar and computes the whole mask only
    where it is forbidden: the tokens must be the masked rows' argmax all the same, and the matcher must end
    where masks_along leaves it."""
    spec = GrammarSpec("json_schema", schema_text(CASES[0]))
    width = embedded.model.config.vocab_size
    draft = embedded.tokenizer.encode('{"name', add_special_tokens=False)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(draft) + 1, width, generator=gen)
    reference = Grammar.start(spec, engine.grammar_tokenizer())
    masks = reference.masks_along(draft, width)
    allowed_top = [int(torch.where(m)[0][0]) for m in masks]
    forbidden_top = int(torch.where(~masks[1])[0][0])
    logits[0, allowed_top[0]] = 50.0  # row 0: its argmax is allowed
    logits[1, forbidden_top] = 60.0  # row 1: its argmax is forbidden, the mask decides
    want = [int(torch.argmax(row.masked_fill(~m, float("-inf")))) for row, m in zip(logits, masks)]
    g = Grammar.start(spec, engine.grammar_tokenizer())
    computed = []
    real_allowed = g.allowed
    g.allowed = lambda w: computed.append(w) or real_allowed(w)
    got = g.greedy_along(draft, logits, [int(t) for t in logits.argmax(dim=-1)])
    assert got == want and got[0] == allowed_top[0] and got[1] != forbidden_top
    assert len(computed) < len(draft) + 1  # at least row 0 needed no mask
    assert g.n_consumed == reference.n_consumed == len(draft)
