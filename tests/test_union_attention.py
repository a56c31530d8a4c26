"""All rows of a forward in one attention call over the union of their cells (the path off the CPU): each row
gets what it gets alone over exactly its cells, to float32 rounding, with grouped-query heads, soft-capping and
sinks; and an engine on that path decodes what plain decoding decodes (chains, trees, two slots, the
checkpoint path), run here on the CPU by choosing the path."""

import pytest
import torch

from engine.draft.registry import NGRAM_CHAIN
from engine.events import ErrorEvent
from engine.forward.attention import CellLayout, RowAttention
from engine.load.models import load_model
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from fresh import forgetting

PROMPT = [1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]
OTHER = [1, 40, 41, 40, 41, 40, 42, 43, 40, 41]


def _layout(rows: list[list[int]]) -> CellLayout:
    ptr = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    return CellLayout(ptr, torch.tensor([c for r in rows for c in r], dtype=torch.long))


ROWS = {
    "chain": [list(range(30 + r)) for r in range(5)],  # a verification: each row one cell more
    "tree": [list(range(20)) + [40], list(range(20)) + [40, 41], list(range(20)) + [40, 43],
             list(range(20)) + [40, 43, 44]],  # a prefix and each node's ancestors
    "two sequences": [[0, 2, 4, 6, 8], [1, 3, 5, 7], [0, 2, 4, 6, 8, 9]],  # cells interleaved in the cache
    "one row": [[5, 6, 7, 60]],
}


@pytest.mark.parametrize("shape", ROWS)
@pytest.mark.parametrize("heads,kv_heads,dim,softcap,sinks", [
    (4, 2, 16, None, False), (6, 6, 24, None, False), (9, 3, 64, 30.0, False), (8, 2, 32, None, True),
    (4, 1, 16, 20.0, True)])
def test_each_row_gets_what_it_gets_alone(shape, heads, kv_heads, dim, softcap, sinks):
    g = torch.Generator().manual_seed(heads * dim + len(shape))
    rows = ROWS[shape]
    k = torch.randn(1, kv_heads, 64, dim, generator=g)
    v = torch.randn(1, kv_heads, 64, dim, generator=g)
    q = torch.randn(len(rows), heads, dim, generator=g)
    s = torch.randn(heads, generator=g) if sinks else None
    union = RowAttention(torch.device("cpu"), torch.float32, use_kernel=False, union=True)
    per_row = RowAttention(torch.device("cpu"), torch.float32, use_kernel=False, union=False)
    got = union.rows(_layout(rows)).attend(q, k, v, dim ** -0.5, softcap=softcap, sinks=s)
    for r, cells in enumerate(rows):
        alone = per_row.rows(_layout([cells])).attend(q[r:r + 1], k, v, dim ** -0.5, softcap=softcap, sinks=s)
        torch.testing.assert_close(got[r], alone[0], rtol=1e-5, atol=1e-5)


def test_the_union_is_the_default_off_the_cpu_only():
    assert RowAttention(torch.device("meta"), torch.float32, use_kernel=False).union
    assert not RowAttention(torch.device("cpu"), torch.bfloat16).union
    assert "one call per layer" in RowAttention(torch.device("meta"), torch.bfloat16).reason


@pytest.fixture(scope="module")
def engine(tiny_dirs):
    target = load_model(str(tiny_dirs["target"]), device="cpu", prepack=False)
    eng = Engine(target, n_ctx=512, n_seq_max=2, calibrate=False)
    eng.ctx.attention = RowAttention(eng.ctx.device, eng.ctx.cache.dtype, use_kernel=False, union=True)
    return eng


fresh_engines = forgetting("engine")


def params(types=(), tree=0, rollback="auto") -> GenParams:
    return GenParams(max_new_tokens=24, ignore_eos=True, sampling=SamplerParams(temp=0.0),
                     spec=SpecParams(types=list(types), n_max=4, adaptive=False, p_min=0.0, tree_nodes=tree,
                                     rollback=rollback))


def emitted(events) -> list[int]:
    events = list(events)
    assert not [e.message for e in events if isinstance(e, ErrorEvent)]
    return [t for e in events for t in e.emitted]


@pytest.mark.parametrize("tree,rollback", [(0, "auto"), (12, "auto"), (0, "checkpoint")])
def test_speculation_on_the_union_decodes_what_plain_decoding_does(engine, tree, rollback):
    events = list(engine.generate(PROMPT, params(NGRAM_CHAIN, tree, rollback)))
    assert any(e.kind == "spec" and e.n_accepted for e in events), "nothing drafted was kept: no verification ran"
    assert emitted(events) == emitted(engine.generate(PROMPT, params()))


def test_two_slots_in_one_round_on_the_union(engine):
    p = params(NGRAM_CHAIN, 12)
    slots = [engine.start(prompt, p) for prompt in (PROMPT, OTHER)]
    events = []
    while any(s.state != "done" for s in slots):
        events.extend(engine.step())
    assert any(getattr(e, "n_seqs", 1) == 2 for e in events)
    for slot, prompt in zip(slots, (PROMPT, OTHER)):
        assert list(slot.generated) == emitted(engine.generate(prompt, params()))
