"""A released sequence leaves nothing behind: after answers in chains and in trees on two slots, no mapping
anywhere in the engine (its records of the sequences, drafters, placement, memory) still holds a
released sequence's id, except the chain's per-sequence counters, which are read after the final event and
replaced when the sequence begins again."""

from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine

TYPES = ["ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache", "draft-simple"]
KEPT = {"engine.chain.seq_stats"}  # by design, see above
NOT_BY_SEQ = {"engine.cost.seen"}  # keyed by forward rows, not by sequence


def mappings_holding(obj, wanted: set[int], path: str = "engine", seen: set | None = None, depth: int = 0):
    """Paths of the dicts reachable from `obj` through the engine's own objects whose keys hold a wanted id."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 6:
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        if any(type(k) is int and k in wanted for k in obj):
            yield path
        for k, v in obj.items():
            yield from mappings_holding(v, wanted, f"{path}[{k!r}]", seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj[:64]):
            yield from mappings_holding(v, wanted, f"{path}[{i}]", seen, depth + 1)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("engine"):
        for k, v in vars(obj).items():
            yield from mappings_holding(v, wanted, f"{path}.{k}", seen, depth + 1)


def test_a_released_sequence_leaves_nothing_behind(tiny_target):
    engine = Engine(tiny_target, tiny_target, n_ctx=1024, n_seq_max=2, n_draft=8, calibrate=False)
    prompt = [1, 5, 6, 7, 8, 5, 6, 7, 8, 5]
    for tree_nodes in (0, 8):
        gp = GenParams(max_new_tokens=24, ignore_eos=True, sampling=SamplerParams(temp=0.0),
                       spec=SpecParams(types=TYPES, n_max=6, tree_nodes=tree_nodes))
        engine.start(prompt, gp, seq=0)
        engine.start(prompt[:7], gp, seq=1)
        while engine.active():
            engine.step()
        engine.release(0)
        engine.release(1)
    holding = set(mappings_holding(engine, {0, 1})) - KEPT - NOT_BY_SEQ
    assert not holding, sorted(holding)
    assert 0 not in engine.budget.records and 1 not in engine.budget.records  # one record a sequence, gone with it
    assert engine.ctx.cache.n_used() == 0


def test_the_walk_finds_what_is_left_behind(tiny_target):
    """The check itself: a mapping planted in a drafter is found."""
    engine = Engine(tiny_target, n_ctx=512, n_seq_max=1, calibrate=False)
    engine.drafter("ngram-simple").planted = {0: "left behind"}
    assert any(p.endswith("['ngram-simple'].planted") for p in mappings_holding(engine, {0}))
