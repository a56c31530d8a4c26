"""The "llama.cpp" preset drafts as llama.cpp's relay does (common/speculative.cpp, common_speculative_draft):
each round the drafters are asked in order, the first that returns a draft of at least n_min tokens is
verified, none after it is asked, and its draft is verified whole (no adaptive length, at most n_max)."""

from engine.events import RoundEvent
from engine.serve.engine import Engine
from ui.presets import preset
from ui.settings import Settings

PROMPT = [1, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 9, 10, 5, 6, 7]


def record_calls(engine, types: list[str], log: list) -> None:
    """Every drafter of the chain logs (name, seq, the position of the token it drafts after, tokens returned)
    for each request it fills."""
    for name in types:
        drafter = engine.drafter(name)  # built now, as the chain would on first use
        def draft(requests, _name=name, _inner=drafter.draft):
            _inner(requests)
            log.extend((_name, r.seq, len(r.prompt), len(r.result)) for r in requests)
        drafter.draft = draft


def test_the_llama_cpp_preset_follows_the_relay_rule(tiny_target):
    """The target drafts for itself as draft-simple: the n-grams win some rounds, the model others."""
    engine = Engine(tiny_target, tiny_target, n_ctx=1024, n_seq_max=1, n_draft=16, calibrate=False)
    chain = ["ngram-simple", "draft-simple", "ngram-map-k", "ngram-mod"]
    p = preset("llama.cpp", chain, {})
    assert p.types == ["ngram-simple", "ngram-map-k", "ngram-mod", "draft-simple"]
    settings = Settings(types=p.types, n_max=p.n_max, n_min=p.n_min, p_min=0.0, p_min_own=False,
                        adaptive=p.adaptive, tree_nodes=p.tree_nodes, max_new_tokens=60, compare=False)
    params = settings.gen_params()
    params.ignore_eos = True
    log: list = []
    record_calls(engine, p.types, log)
    engine.start(PROMPT, params, seq=0)
    events = []
    while engine.active():
        events += [ev for ev in engine.step() if isinstance(ev, RoundEvent) and ev.kind != "prefill"]
    engine.release(0)
    winners = set()
    for ev in events:
        asked = [(name, n) for name, seq, pos, n in log if seq == 0 and pos == ev.pos_sampled]
        names = [name for name, _ in asked]
        assert names == p.types[:len(names)], names  # asked in the relay's order, once each
        first = next(((name, n) for name, n in asked if n >= max(1, p.n_min)), None)
        if first is None:
            assert not ev.drafted and len(names) == len(p.types)  # everyone asked, nobody drafted
            continue
        winners.add(ev.drafter)
        assert (ev.drafter, len(ev.drafted)) == first  # the first draft, verified whole
        assert len(ev.drafted) <= p.n_max and ev.verify_mode == "match"
        assert names[-1] == first[0]  # nobody after the winner was asked
        assert ev.rollback in ("none", "seq_rm") and (ev.rm_range is None) == (ev.n_accepted == len(ev.drafted))
    assert "draft-simple" in winners and winners & {"ngram-simple", "ngram-map-k", "ngram-mod"}, winners
