"""The cell cache against plain forwards: appends, range removals, several sequences in one batch."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.batch import Batch
from engine.memory.context import ModelContext
from tiny import make_llama

MODEL = make_llama(seed=3)


def plain_last_logits(tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return MODEL(input_ids=torch.tensor([tokens])).logits[0, -1]


def append(ctx: ModelContext, seq: int, tokens: list[int], start: int) -> torch.Tensor:
    b = Batch()
    for i, t in enumerate(tokens):
        b.add(t, start + i, seq, i == len(tokens) - 1)
    return ctx.decode(b).logits[-1]


def test_prefill_matches_plain_forward():
    ctx = ModelContext(MODEL, n_ctx=64, n_seq_max=1)
    toks = [5, 9, 11, 13, 17, 19]
    b = Batch()
    for i, t in enumerate(toks):
        b.add(t, i, 0, True)
    got = ctx.decode(b).logits
    with torch.inference_mode():
        want = MODEL(input_ids=torch.tensor([toks])).logits[0]
    assert torch.allclose(got, want, atol=1e-4)


def test_two_sequences_in_one_forward_equal_separate_forwards():
    ctx = ModelContext(MODEL, n_ctx=64, n_seq_max=2)
    a, c = [5, 6, 7, 8, 9], [20, 21, 22]
    b = Batch()
    for i, t in enumerate(a):
        b.add(t, i, 0, True)
    for i, t in enumerate(c):
        b.add(t, i, 1, True)
    got = ctx.decode(b).logits
    with torch.inference_mode():
        want_a = MODEL(input_ids=torch.tensor([a])).logits[0]
        want_c = MODEL(input_ids=torch.tensor([c])).logits[0]
    assert torch.allclose(got[:5], want_a, atol=1e-4)
    assert torch.allclose(got[5:], want_c, atol=1e-4)
    # and a later mixed batch: one row per sequence
    b = Batch()
    b.add(30, 5, 0, True)
    b.add(31, 3, 1, True)
    got = ctx.decode(b).logits
    assert torch.allclose(got[0], plain_last_logits(a + [30]), atol=1e-4)
    assert torch.allclose(got[1], plain_last_logits(c + [31]), atol=1e-4)


def test_draft_append_and_seq_rm_tail_equals_plain():
    ctx = ModelContext(MODEL, n_ctx=64, n_seq_max=1)
    prompt = [5, 6, 7, 8]
    append(ctx, 0, prompt, 0)
    append(ctx, 0, [40, 41, 42, 43], 4)  # sampled + 3 draft tokens
    assert ctx.cache.seq_pos_max(0) == 7
    ctx.seq_rm(0, 6, -1)  # keep sampled + first draft token
    assert ctx.cache.seq_pos_max(0) == 5
    got = append(ctx, 0, [50], 6)
    assert torch.allclose(got, plain_last_logits(prompt + [40, 41, 50]), atol=1e-4)


def test_freed_cells_are_reused_and_live_range_shrinks():
    ctx = ModelContext(MODEL, n_ctx=16, n_seq_max=1)
    append(ctx, 0, list(range(5, 15)), 0)
    assert ctx.cache.n_live == 10
    ctx.seq_rm(0, 4, -1)
    assert ctx.cache.n_live == 4 and ctx.cache.n_used() == 4
    append(ctx, 0, [30, 31], 4)
    assert sorted(ctx.cache.seq_cells(0).tolist()) == list(range(6))


def test_seq_cp_shares_prefix_and_seq_keep_drops_others():
    ctx = ModelContext(MODEL, n_ctx=32, n_seq_max=3)
    prefix = [5, 6, 7, 8]
    append(ctx, 0, prefix, 0)
    ctx.cache.seq_cp(0, 1)
    assert ctx.cache.n_used() == 4  # stored once
    got1 = append(ctx, 1, [9], 4)
    got0 = append(ctx, 0, [10], 4)
    assert torch.allclose(got1, plain_last_logits(prefix + [9]), atol=1e-4)
    assert torch.allclose(got0, plain_last_logits(prefix + [10]), atol=1e-4)
    ctx.cache.seq_keep(1)
    assert ctx.cache.seq_pos_max(0) == -1 and ctx.cache.seq_pos_max(1) == 4
    assert ctx.cache.n_used() == 5


def test_bad_writes_are_refused_and_change_nothing():
    ctx = ModelContext(MODEL, n_ctx=8, n_seq_max=1)
    append(ctx, 0, [5, 6, 7], 0)
    b = Batch()
    b.add(9, 2, 0, True)  # position 2 is taken
    with pytest.raises(ValueError, match="already in the cache"):
        ctx.decode(b)
    b = Batch()
    b.add(9, 3, 0, True)
    b.add(8, 3, 0, True)  # position 3 twice in one batch, not as a tree's siblings
    with pytest.raises(ValueError, match="sequence 0: a position of this batch is already in the cache"):
        ctx.decode(b)
    b = Batch()
    for i in range(6):
        b.add(9, 3 + i, 0, True)
    with pytest.raises(RuntimeError, match="KV cache full"):
        ctx.decode(b)
    b = Batch()
    b.add(9, 3, 5, True)
    with pytest.raises(ValueError, match="out of range"):
        ctx.decode(b)
    assert ctx.cache.n_used() == 3 and ctx.cache.seq_pos_max(0) == 2


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 5)), min_size=1, max_size=6), st.data())
def test_random_appends_and_removals_match_plain_forward(ops, data):
    """After any appends and tail removals, the next token's logits equal a plain forward of the kept tokens."""
    ctx = ModelContext(MODEL, n_ctx=64, n_seq_max=2)
    kept: list[int] = []
    other: list[int] = []
    for n_add, n_cut in ops:
        new = data.draw(st.lists(st.integers(4, 63), min_size=n_add, max_size=n_add))
        append(ctx, 0, new, len(kept))
        kept += new
        side = data.draw(st.integers(4, 63))  # an interleaved second sequence must not leak in
        append(ctx, 1, [side], len(other))
        other.append(side)
        cut = min(n_cut, len(kept) - 1)
        if cut > 0:
            p0 = len(kept) - cut
            ctx.seq_rm(0, p0, -1)
            kept = kept[:p0]
        assert ctx.cache.seq_pos_max(0) == len(kept) - 1
        assert ctx.cache.n_used() == len(kept) + len(other)
    last = data.draw(st.integers(4, 63))
    got = append(ctx, 0, [last], len(kept))
    assert torch.allclose(got, plain_last_logits(kept + [last]), atol=1e-4)


@pytest.mark.parametrize("by_seq,window", [(True, None), (False, None), (True, 6), (False, 4)])
def test_batch_layout_is_the_layout_the_mask_gives(by_seq, window):
    """The lean forward reads which cells each row sees from the batch (attention.batch_layout), with no mask;
    it must list exactly the cells, in the order, that reading the mask gives: over shared prefixes, removed
    ranges, chains and draft trees with siblings, and a sliding window."""
    from engine.forward.attention import batch_layout, cell_layout
    from engine.memory.cells import CellCache

    g = torch.Generator().manual_seed(7 + int(by_seq) + (window or 0))

    def draw(n: int) -> int:
        return int(torch.randint(n, (1,), generator=g))

    for trial in range(40):
        cache = CellCache(1, 1, 4, n_cells=96, n_seq_max=3, sliding_window=window, by_seq=by_seq)
        lens = [0, 0, 0]
        b = Batch()
        for i in range(3 + draw(8)):
            b.add(i, i, 0, False)
        cache.prepare(b)
        lens[0] = len(b)
        if draw(2):  # seq 1 shares seq 0's prefix, stored once
            cache.seq_cp(0, 1, 0, lens[0])
            lens[1] = lens[0]
        for seq in (1, 2):
            b = Batch()
            for i in range(1 + draw(6)):
                b.add(i, lens[seq] + i, seq, False)
            cache.prepare(b)
            lens[seq] += len(b)
        if draw(2):  # a rejected tail removed
            cut = max(1, lens[2] - 1 - draw(3))
            cache.seq_rm(2, cut, -1)
            lens[2] = cut
        b = Batch()
        for seq in range(3):
            root = b.add(1, lens[seq], seq, True)
            if draw(3) == 0:  # a chain of several rows
                for d in range(1, 1 + draw(3)):
                    b.add(2, lens[seq] + d, seq, True)
                continue
            frontier = [(root, lens[seq])]
            for _ in range(draw(7)):  # a tree: children, siblings among them
                parent, pos = frontier[draw(len(frontier))]
                frontier.append((b.add(3 + draw(5), pos + 1, seq, True, parent=parent), pos + 1))
        mask = cache.prepare(b)
        want = cell_layout(mask, cache.cell_pos[: mask.shape[-1]])
        got = batch_layout(cache.cell_pos, cache.cell_seq, cache.n_live, b, cache.last_cells, window)
        assert torch.equal(got.row_ptr, want.row_ptr), trial
        assert torch.equal(got.cells, want.cells), trial


def test_a_kept_branch_moved_home_stays_in_the_live_range():
    """A tree's second child takes a spare cell (its home is its sibling's); when the target keeps it and rejects
    the sibling, the sibling's cell is freed and the kept node moves home. That home may lie past what is left
    live after the branch is freed: the live range must still cover it, or attention would not see the node."""
    from engine.memory.cells import CellCache

    cache = CellCache(1, 1, 4, n_cells=32, n_seq_max=2, by_seq=True)
    b = Batch()
    for i in range(3):
        b.add(i, i, 1, False)
    cache.prepare(b)  # seq 1's region starts at cell 16
    tree = Batch()
    root = tree.add(7, 3, 1, True)
    tree.add(8, 4, 1, True, parent=root)  # the first child takes the home cell of position 4
    tree.add(9, 4, 1, True, parent=root)  # its sibling a spare cell below (seq 0's free region)
    cache.prepare(tree)
    root_cell, first, second = cache.last_cells.tolist()
    assert second < first == cache.home(1, 4)
    cache.rm_cells(torch.tensor([first]))
    cache.settle([root_cell, second])
    assert cache.seq_cells(1).tolist() == [16, 17, 18, root_cell, first]
    assert cache.n_live == first + 1
