"""Trees of drafts: merged proposals, a tree verified in one forward through the cell cache (each node sees the
committed sequence and its ancestors, to the bit), the walk of the target, and generation through trees that
is token-identical to plain decoding, same-seed identical when sampling, with slots and the checkpoint path;
memories that cannot hold branches refuse with a reason."""

import pytest
import torch

from engine.batch import Batch
from engine.memory.context import ModelContext
from engine.draft.registry import NGRAM_CHAIN
from engine.params import GenParams, SpecParams
from engine.sampling import Sampler, SamplerParams
from engine.serve.engine import Engine
from engine.draft.tree import DraftTree, tree_rows
from engine.round.verify import tree_match
from fresh import forgetting
from test_engine import PROMPTS, SMALL_NGRAMS, tokens


def test_chains_merge_into_one_tree_and_each_drafter_is_credited_its_own():
    tree = DraftTree()
    assert tree.add_chain([5, 6, 7], "ngram-simple") == [0, 1, 2]
    assert tree.add_chain([5, 6, 9, 10], "draft-head") == [0, 1, 3, 4]  # the shared prefix is stored once
    assert tree.add_chain([8], "ngram-mod") == [5]
    assert tree.parents == [-1, 0, 1, 1, 3, -1] and tree.drafters[3] == "draft-head"
    assert not tree.is_chain() and tree.max_depth() == 4 and tree.n_leaves() == 3
    assert tree.add_chain([5, 11, 12], "ngram-cache", limit=7) == [0, 6]  # stops at the node limit
    path = [0, 1, 3]  # the target kept 5 6 9
    assert tree.credit(path) == {"ngram-simple": (3, 2), "draft-head": (4, 3), "ngram-mod": (1, 0),
                                 "ngram-cache": (2, 1)}


def test_tree_match_walks_the_targets_tokens():
    tree = DraftTree()
    tree.add_chain([5, 6, 7], "a")
    tree.add_chain([5, 8], "b")
    logits = torch.zeros(1 + len(tree), 16)
    # row 0 (root) -> 5 (node 0, row 1) -> 8 (node 3, row 4) -> 2: a leaf's row gives the bonus
    for row, tok in [(0, 5), (1, 8), (4, 2), (2, 7), (3, 1)]:
        logits[row, tok] = 5.0
    verdict, path = tree_match(Sampler(SamplerParams(temp=0.0)), logits, tree)
    assert path == [0, 3] and verdict.tokens == [5, 8, 2] and verdict.n_accepted == 2


def _decode(ctx, batch):
    return ctx.decode(batch).logits


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
def test_each_node_gets_the_logits_of_plain_decoding_of_its_path(tiny_target, kernel):
    """A tree in one forward: every node's row equals, bit for bit, the row of plain decoding along its own path,
    and after the walk the kept path's cells are the cache plain decoding leaves."""
    ctx = ModelContext(tiny_target.model, n_ctx=128, n_seq_max=2, attention_kernel=kernel)
    prompt = PROMPTS[0]
    tree = DraftTree()
    tree.add_chain([20, 21, 22], "a")
    tree.add_chain([20, 30, 31], "b")
    tree.add_chain([40, 41], "c")
    for seq in (0, 1):
        b = Batch()
        for i, t in enumerate(prompt[:-1]):
            b.add(t, i, seq, True)
        _decode(ctx, b)
    b = Batch()
    rows = tree_rows(b, tree, prompt[-1], len(prompt) - 1, 0)
    got = _decode(ctx, b)
    cells = ctx.cache.last_cells[rows]
    for node in range(len(tree)):
        path = [tree.tokens[n] for n in tree.path(node)]
        ctx.seq_rm(1, len(prompt) - 1, -1)
        b1 = Batch()
        for i, t in enumerate([prompt[-1]] + path):
            b1.add(t, len(prompt) - 1 + i, 1, True)
        plain = _decode(ctx, b1)
        assert torch.equal(got[node + 1], plain[-1]), f"node {node} differs from plain decoding of its path"
        assert torch.equal(got[0], plain[0])
    keep = [0, 1 + 0, 1 + 3]  # the root's row, then nodes 0 and 3: 20 30
    ctx.cache.rm_cells(cells[[i for i in range(len(rows)) if i not in keep]])
    ctx.cache.settle(cells[keep].tolist())
    assert ctx.cache.seq_cells(0).numel() == len(prompt) + 2
    assert sorted(ctx.cache.cell_pos[ctx.cache.seq_cells(0)].tolist()) == list(range(len(prompt) + 2))
    nxt = Batch()
    nxt.add(31, len(prompt) + 2, 0, True)
    after = _decode(ctx, nxt)
    assert torch.equal(after[0], got[1 + 4])  # node 4 (31) saw these cells in the tree


@pytest.fixture(scope="module")
def engine(tiny_target, tiny_draft):
    return Engine(tiny_target, draft=tiny_draft, n_ctx=768, n_seq_max=4, drafter_params=SMALL_NGRAMS)


fresh_engines = forgetting("engine")


def _run(engine, prompt, types, temp=0.0, seed=0, n=40, tree_nodes=12, rollback="auto", tree_verify="rejection"):
    params = GenParams(max_new_tokens=n, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                       spec=SpecParams(types=list(types), n_max=12, adaptive=False, p_min=0.0,
                                       tree_nodes=tree_nodes, rollback=rollback, tree_verify=tree_verify))
    return list(engine.generate(prompt, params))


@pytest.mark.parametrize("temp", [0.0, 0.9])
@pytest.mark.parametrize("rollback", ["auto", "checkpoint"])
def test_generation_through_trees_is_plain_decoding(engine, temp, rollback):
    """Token for token at temperature 0, and at 0.9 where the target walks (tree_verify "walk": the drafters
    choose, the walk draws as plain sampling does). draft-simple's draws from q at 0.9 ("rejection") are verified
    by rejection sampling: the same distribution (tests/test_bench_dist.py), the same text again for the same
    seed, the cache as plain."""
    n_branched = n_kept = n_tried = 0
    for seed, prompt in enumerate(PROMPTS):
        plain = tokens(_run(engine, prompt, [], temp=temp, seed=seed, tree_nodes=0))
        if temp > 0:
            walked = _run(engine, prompt, NGRAM_CHAIN + ["draft-simple"], temp=temp, seed=seed, rollback=rollback,
                          tree_verify="walk")
            assert tokens(walked) == plain and not any(e.tree_tries for e in walked)
        events = _run(engine, prompt, NGRAM_CHAIN + ["draft-simple"], temp=temp, seed=seed, rollback=rollback)
        n_tried += sum(bool(e.tree_tries) for e in events)
        again = _run(engine, prompt, NGRAM_CHAIN + ["draft-simple"], temp=temp, seed=seed, rollback=rollback)
        assert tokens(events) == (plain if temp == 0 else tokens(again))
        trees = [e for e in events if e.verify_mode == "tree"]
        n_branched += sum(len(set(e.tree_parents)) < len(e.tree_parents) for e in trees)
        n_kept += sum(e.n_accepted for e in trees)
        seq = events[-1].seq
        assert engine.ctx.cache.seq_cells(seq).numel() == len(engine.slots[seq].tokens)
    assert n_branched > 0, "no round verified a tree with branches"
    assert n_kept > 0, "no tree node was ever kept"
    assert (n_tried > 0) == (temp > 0), "draws from q are tested by rejection sampling at temperature > 0 only"


def test_slots_with_trees_equal_running_alone(engine):
    alone = [tokens(_run(engine, p, [])) for p in PROMPTS]
    params = GenParams(max_new_tokens=40, ignore_eos=True,
                       spec=SpecParams(types=NGRAM_CHAIN + ["draft-simple"], n_max=12, adaptive=False, p_min=0.0,
                                       tree_nodes=12))
    for seq in list(engine.slots):
        engine.release(seq)
    got = {s: [] for s in range(3)}
    for s, p in enumerate(PROMPTS):
        engine.start(p, params, seq=s)
    while engine.active():
        for e in engine.step():
            got[e.seq].extend(e.emitted)
    assert [got[s] for s in range(3)] == alone
    for seq in range(3):
        engine.release(seq)
    assert engine.ctx.cache.n_used() == 0


def test_a_recurrent_memory_refuses_trees_with_a_reason(tmp_path):
    from tiny import load_tiny, save_arch

    eng = Engine(load_tiny(save_arch(tmp_path / "jamba", "jamba")), n_ctx=256, n_seq_max=2,
                 drafter_params=SMALL_NGRAMS, calibrate=False)
    events = _run(eng, PROMPTS[0], NGRAM_CHAIN, n=20)
    assert any("trees of drafts are off" in note for note in events[0].notes)
    assert all(e.verify_mode != "tree" for e in events) and any(e.kind == "spec" for e in events)
    assert tokens(events) == tokens(_run(eng, PROMPTS[0], [], n=20, tree_nodes=0))


def _scored(chains: list[tuple[list[int], list[float]]]) -> DraftTree:
    tree = DraftTree()
    for toks, scores in chains:
        tree.add_chain(toks, "x", scores=scores)
    return tree


def test_disagreeing_drafters_share_one_chance():
    tree = DraftTree()
    tree.add_chain([5, 6], "a", scores=[0.6, 0.5])
    tree.add_chain([7, 8], "b", scores=[0.6, 0.3])
    tree.add_chain([5, 9], "c", scores=[0.4, 0.05])  # under the 5: 0.5 + 0.05 fits in its 0.6
    tree.bound_scores()
    # the two first tokens cannot both be right: 0.6 + 0.6 becomes 0.5 + 0.5, their subtrees scaled alike
    assert tree.scores == pytest.approx([0.5, 0.5 * 0.5 / 0.6, 0.5, 0.3 * 0.5 / 0.6, 0.05 * 0.5 / 0.6])
    again = list(tree.scores)
    tree.bound_scores()
    assert tree.scores == pytest.approx(again)  # already chances: unchanged


def test_the_budget_keeps_what_pays_for_the_whole_forward():
    from engine.budget.tree_budget import SlotLedger, choose_nodes
    from engine.cost.curve import CostModel

    knee = CostModel(sizes=[1, 8, 16, 32], seconds=[1.0, 1.05, 2.0, 4.0])  # nearly free up to 8 rows
    deep = _scored([([5, 6, 7, 8], [0.9, 0.8, 0.7, 0.6]), ([9], [0.001])])
    state = SlotLedger()
    one = choose_nodes({0: deep}, 1, knee, state)
    assert one.kept[0] == [0, 1, 2, 3] and one.n_rows == 5  # one slot: the deep path, not the 0.1% branch
    assert abs(one.expected - 4.0) < 1e-9
    # one more node would have to bring what its row costs: 4 expected tokens times c(6) / c(5) - 1
    assert one.threshold == pytest.approx(4.0 * (knee.c(6) / knee.c(5) - 1)) and state.threshold == one.threshold
    assert 0.001 < one.threshold < 0.05  # the 0.1% branch is below it: that is why it stayed out
    # four slots: the free rows are shared, one node each; the deeper ones would cost more than they bring
    four = choose_nodes({s: _scored([([5, 6, 7, 8], [0.9, 0.8, 0.7, 0.6])]) for s in range(4)}, 4, knee, SlotLedger())
    assert all(v == [0] for v in four.kept.values()) and four.n_rows == 8
    assert four.threshold > 0.5  # past the knee a node must be all but sure: the next depths need not be drafted
    steep = CostModel(sizes=[1, 2, 32], seconds=[1.0, 2.0, 32.0])  # every row costs a whole forward
    none = choose_nodes({0: deep}, 1, steep, SlotLedger(probe_every=100))
    assert none.kept[0] == [] and none.n_rows == 1 and "plain decoding" in none.why
    state = SlotLedger(probe_every=2)
    assert choose_nodes({0: deep}, 1, steep, state).kept[0] == []
    assert choose_nodes({0: deep}, 1, steep, state).kept[0] == [0]  # the probe: its best node, so estimates can recover


def test_slots_whose_drafts_are_refused_rest_and_draft_again_together_on_probe_rounds():
    from engine.budget.tree_budget import SlotLedger, choose_nodes
    from engine.cost.curve import CostModel

    steep = CostModel(sizes=[1, 2, 32], seconds=[1.0, 2.0, 32.0])  # every row costs a whole forward
    state = SlotLedger(probe_every=4, rest_after=2, fair=False)  # fair: the probes would wait for a balance
    drafted: dict[int, list[int]] = {0: [], 1: []}
    probes = []
    for _ in range(24):
        state.next_round()
        offered = {seq: _scored([([5, 6], [0.3, 0.2])]) for seq in (0, 1) if not state.rests(seq)}
        for seq in {0, 1} - set(offered):
            state.rest(seq)
        for seq in offered:
            drafted[seq].append(state.n_rounds)
        if offered:
            out = choose_nodes(offered, 2, steep, state)
            probes += [(state.n_rounds, seq) for seq, kept in out.kept.items() if kept]
    # two refused rounds, then both rest and draft on the same rounds only, each time a probe of their best path;
    # each probe that wins no row on its merit doubles the interval to the next
    assert drafted[0] == drafted[1] == [1, 2, 4, 8, 16]
    assert all(n in (4, 8, 16) for n, _ in probes) and len(probes) >= 3
    # a node kept on its merit ends the rest: the slot drafts every round again
    cheap = CostModel(sizes=[1, 2, 32], seconds=[1.0, 1.0, 1.0])
    choose_nodes({0: _scored([([5, 6], [0.9, 0.8])])}, 2, cheap, state)
    assert state.records[0].refused == 0 and state.records[0].interval is None
    state.next_round()
    assert not state.rests(0) and state.rests(1)


def test_the_cost_model_learns_the_forwards_the_engine_runs():
    from engine.cost.curve import CostModel

    # a calibration that found rows 4 to 8 free; in service 4 rows take 1.0 and 8 rows 1.3
    cost = CostModel(sizes=[1, 4, 8, 16], seconds=[1.0, 1.0, 1.0, 2.0], min_seen=3)
    assert cost.c(8) / cost.c(4) == pytest.approx(1.0)
    for _ in range(2):
        cost.observe(4, 1.0)
        cost.observe(8, 1.3)
    assert cost.c(8) / cost.c(4) == pytest.approx(1.0)  # seen too few times to be trusted yet
    cost.observe(4, 1.0)
    cost.observe(8, 1.3)
    assert cost.c(8) / cost.c(4) == pytest.approx(1.3)
    # sizes not seen take the calibrated step from the size seen below them, never less than a smaller size
    assert cost.c(16) / cost.c(8) == pytest.approx(2.0)
    assert cost.c(6) / cost.c(4) == pytest.approx(1.0) and cost.c(9) >= cost.c(8)
    # a decaying average: a machine that got slower at 8 rows shows in a few forwards
    for _ in range(20):
        cost.observe(8, 1.6)
    assert cost.c(8) / cost.c(4) == pytest.approx(1.6, rel=0.02)


def test_the_budget_never_slows_a_slot_below_plain_decoding_to_speed_another():
    from engine.budget.tree_budget import SlotLedger, choose_nodes
    from engine.cost.curve import CostModel

    cost = CostModel(sizes=[1, 2, 32], seconds=[1.0, 1.0, 4.0])  # 2 rows free, then 0.1 of a forward a row
    sure = ([5, 6, 7, 8], [0.95, 0.9, 0.85, 0.8])
    # slot 1 has no draft: any row that costs slows it, however much slot 0 would gain
    assert choose_nodes({0: _scored([sure])}, 2, cost, SlotLedger(probe_every=100)).kept[0] == []
    greedy = choose_nodes({0: _scored([sure])}, 2, cost, SlotLedger(probe_every=100, fair=False))
    assert greedy.kept[0] == [0, 1, 2, 3]  # what the batch's goodput alone would take
    # both slots draft: the forward may grow by what the slot expecting the least gains, its own node included
    both = choose_nodes({0: _scored([sure]), 1: _scored([([9], [0.55])])}, 2, cost, SlotLedger(probe_every=100))
    assert both.kept == {0: [0, 1, 2, 3], 1: [0]} and both.n_rows == 7  # 1.5x the forward, slot 1 expects 1.55
    weak = choose_nodes({0: _scored([sure]), 1: _scored([([9], [0.3])])}, 2, cost, SlotLedger(probe_every=100))
    # slot 1 expects 1.3: the forward may grow to 1.3x (5 rows), so slot 0 gets two nodes, not four
    assert weak.kept == {0: [0, 1], 1: [0]} and weak.n_rows == 5
    hopeless = choose_nodes({0: _scored([sure]), 1: _scored([([9], [0.05])])}, 2, cost, SlotLedger(probe_every=100))
    assert hopeless.n_rows == 2  # slot 1's 1.05 pays for no row past the free ones


def test_the_fair_budget_gives_every_slot_its_likely_node_before_one_slot_goes_deep():
    from engine.budget.tree_budget import SlotLedger, choose_nodes
    from engine.cost.curve import CostModel

    # 4 slots: past 4 rows each row costs 0.05 of a forward. One slot copies (a long sure chain), three write
    # freely (one node each, 0.5 likely). The deep chain ranks first: a prefix of the global ranking makes the
    # forward 1.4x dear before the open slots' nodes come in, and then none of them may join
    cost = CostModel(sizes=[1, 4, 64], seconds=[1.0, 1.0, 4.0])
    sure = ([5, 6, 7, 8, 9, 10, 11, 12], [0.98, 0.96, 0.94, 0.92, 0.9, 0.88, 0.86, 0.84])
    trees = {0: _scored([sure]), **{s: _scored([([20 + s], [0.5])]) for s in (1, 2, 3)}}
    out = choose_nodes(trees, 4, cost, SlotLedger(probe_every=100))
    assert all(out.kept[s] == [0] for s in (1, 2, 3))  # each open slot expects 1.5 from a forward of at most 1.5x
    assert out.kept[0] == list(range(len(out.kept[0]))) and 1 <= len(out.kept[0]) <= 7
    assert cost.c(out.n_rows) / cost.c(4) <= 1.5 + 1e-9
    assert out.goodput > 4 / cost.c(4) * 1.3


def test_a_slot_behind_plain_decoding_asks_more_of_its_scores_and_one_ahead_shares_a_dearer_forward():
    from engine.budget.tree_budget import SlotLedger, choose_nodes
    from engine.cost.curve import CostModel

    cost = CostModel(sizes=[1, 2, 32], seconds=[1.0, 1.0, 4.0])  # 2 rows free, then 0.1 of a forward a row
    sure = ([5, 6, 7, 8], [0.95, 0.9, 0.85, 0.8])

    def offer():
        return {0: _scored([sure]), 1: _scored([([9], [0.55])])}

    even = choose_nodes(offer(), 2, cost, SlotLedger(probe_every=100))
    assert even.n_rows == 7  # slot 1's 0.55 pays for a forward of 1.5x
    behind = SlotLedger(probe_every=100)
    behind.settle(1, 1, 1.3)  # slot 1's last round cost 1.3 plain forwards and gave it one token
    assert choose_nodes(offer(), 2, cost, behind).n_rows == 4  # now its 0.55 - 0.3 pays for 1.2x at most
    alone = choose_nodes({1: _scored([([9], [0.55])])}, 1, cost, behind)
    assert alone.kept[1] == [0]  # alone in the forward its rows cost only its own time: the goodput decides
    ahead = SlotLedger(probe_every=100)
    ahead.settle(1, 3, 1.0)  # slot 1 is 2 tokens ahead of plain decoding
    bare_ahead = choose_nodes({0: _scored([sure])}, 2, cost, ahead, bare=[1])
    assert bare_ahead.kept[0] == [0, 1, 2, 3]  # even without a draft it can pay for slot 0's whole chain
    refused = choose_nodes({0: _scored([sure])}, 2, cost, SlotLedger(probe_every=100), bare=[1])
    assert refused.kept[0] == [] and "without slowing a slot below plain decoding" in refused.why
    ahead.begin(1)  # a new generation in the slot starts even with plain decoding
    assert ahead.records[1].balance is None


def test_a_probe_is_a_slots_own_exploration_and_needs_the_others_to_afford_its_row():
    from engine.budget.tree_budget import SlotLedger, choose_nodes
    from engine.cost.curve import CostModel

    steep = CostModel(sizes=[1, 2, 32], seconds=[1.0, 2.0, 32.0])  # every row costs a whole forward
    weak = ([5], [0.2])
    alone = SlotLedger(probe_every=1)
    assert choose_nodes({0: _scored([weak])}, 1, steep, alone).kept[0] == [0]  # alone: it explores on its own account
    shared = SlotLedger(probe_every=1)
    assert choose_nodes({0: _scored([weak])}, 2, steep, shared, bare=[1]).kept[0] == []  # slot 1 would pay for it
    shared.settle(1, 3, 1.0)
    assert choose_nodes({0: _scored([weak])}, 2, steep, shared, bare=[1]).kept[0] == [0]  # slot 1 is ahead: it can


def test_the_budget_learns_how_far_each_drafters_scores_can_be_trusted():
    from engine.budget.tree_budget import SlotLedger, choose_nodes
    from engine.cost.curve import CostModel

    # past 2 rows each row costs 0.1 of a forward: with 2 slots a node pays if reached more than ~25% of the time
    cost = CostModel(sizes=[1, 2, 12], seconds=[1.0, 1.0, 2.0])

    def offer():
        return {0: _scored([([5], [0.8])]), 1: _scored([([6], [0.8])])}

    state = SlotLedger(probe_every=1000, fair=False)  # the batch's goodput alone: fairness is tested above
    assert choose_nodes(offer(), 2, cost, state).kept == {0: [0], 1: [0]}  # believed at first
    for _ in range(12):  # slot 0's nodes are never reached, slot 1's always
        trees = offer()
        out = choose_nodes(trees, 2, cost, state)
        for seq, path in ((0, []), (1, [0])):
            if out.kept[seq]:
                state.correction.observe(seq, trees[seq].keep(out.kept[seq]), path, out.factors[seq])
    out = choose_nodes(offer(), 2, cost, state)
    assert out.kept[0] == [] and out.kept[1] == [0]
    assert state.correction.factor(0, "x") < 0.35 and state.correction.factor(1, "x") > 1.1
    assert 2.9 < out.expected <= 3.0  # slot 1's node raised from 0.8 toward what it showed, never past 1
    state.forget(0)
    assert state.correction.factor(0, "x") == 1.0


def test_cost_curve_smooths_small_sizes_through_one_quadratic_and_keeps_large_ones():
    from engine.cost.curve import smooth_small

    sizes = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    true = [50 + 1.0 * n + 0.15 * n * n for n in sizes]
    # a lucky fast timing at 8 rows and a slow one at 6: the ratio c(8) / c(4) that decides a draft beside 4
    # slots reads 1.04 where it is 1.20; the fit gives it back within 2%
    noisy = [t * f for t, f in zip(true, [1.0, 1.02, 0.99, 1.0, 1.06, 0.87, 1.0, 1.01, 1.3, 1.0])]
    out = smooth_small(sizes, noisy)
    assert noisy[5] / noisy[3] < 1.05
    assert out[5] / out[3] == pytest.approx(true[5] / true[3], rel=0.02)
    assert out[8:] == noisy[8:]  # 24 and 32 rows: measured, not fitted
    assert smooth_small([1, 2, 4], [1.0, 1.5, 1.2]) == [1.0, 1.5, 1.2]  # too few sizes to fit: as measured


def test_cost_curve_pools_a_spike_instead_of_lifting_every_size_after_it(tiny_target):
    from engine.cost.curve import non_decreasing

    # one busy timing at 2 rows must not make 3 to 8 rows look as slow as it
    assert non_decreasing([1.0, 1.6, 1.0, 1.0, 1.1, 1.2]) == pytest.approx([1.0, 1.175, 1.175, 1.175, 1.175, 1.2])
    assert non_decreasing([1.0, 1.0, 1.5, 2.0]) == [1.0, 1.0, 1.5, 2.0]
    cost = Engine(tiny_target, n_ctx=256, n_seq_max=2).cost
    assert cost.sizes[0] == 1 and all(a <= b for a, b in zip(cost.seconds, cost.seconds[1:]))


def test_rows_of_slots_with_shorter_contexts_than_the_calibration_cost_less_and_the_budget_takes_them():
    from engine.budget.tree_budget import SlotLedger, choose_nodes
    from engine.cost.curve import CostModel

    # rows cost 0.05 of a one-row forward each after 256 cells, 0.04 of it their attention (1e-4 s per cell)
    curve = CostModel(sizes=[1, 4, 8, 16], seconds=[0.64, 0.79, 0.99, 1.39], cell_seconds=1e-4, calibrated_cells=256)
    long, short = curve.for_cells(4, 256), curve.for_cells(4, 56)
    assert long.c(8) == pytest.approx(curve.c(8)) and short.c(4) == pytest.approx(curve.c(4))
    # 200 cells fewer: each draft row beyond the 4 base rows saves 0.02 s of attention, 1/32 of a one-row forward
    assert short.c(8) == pytest.approx(curve.c(8) - 4 * 0.02 / 0.64)
    assert curve.for_cells(4, 1000).c(8) == pytest.approx(curve.c(8))  # longer contexts: the curve, no more
    assert CostModel(sizes=[1, 8], seconds=[1.0, 1.4]).for_cells(4, 10).c(8) == pytest.approx(1.4)  # unknown
    # four slots each offering one node reached 20% of the time: dearer than it brings after 256 cells (0.0625
    # of the base forward per row against 0.2 / 4 tokens), cheaper than it brings after 56
    trees = {s: _scored([([5], [0.2])]) for s in range(4)}
    assert all(not v for v in choose_nodes(trees, 4, long, SlotLedger(fair=False, probe_every=100)).kept.values())
    trees = {s: _scored([([5], [0.2])]) for s in range(4)}
    assert all(v == [0] for v in choose_nodes(trees, 4, short, SlotLedger(fair=False, probe_every=100)).kept.values())


@pytest.mark.parametrize("n_seq_max", [2, 4])
def test_the_calibration_times_the_attention_a_row_does_per_cell_and_what_a_sequence_costs(tiny_target, n_seq_max):
    """A tiny model's attention is lost in timing noise, so its forwards report the time of a model whose rows
    cost 1 ms each plus 10 us per cell they see, and each sequence in the forward 2 ms more: the calibration
    must find those 10 us and 2 ms, and a slot's share of a forward must count both its row and the 2 ms."""
    from dataclasses import replace

    engine = Engine(tiny_target, n_ctx=512, n_seq_max=n_seq_max, calibrate=False)
    real = engine.ctx.decode

    def timed(batch):
        res = real(batch)
        rows = sum(1e-3 + 1e-5 * (p + 1) for p in batch.pos)
        return replace(res, seconds=0.02 + rows + 2e-3 * len(set(batch.seq)))

    engine.ctx.decode = timed
    cost = engine.calibrate()
    assert cost.calibrated_cells == 256 + 4  # 8 rows after 256 cells: 260 on average with their own
    assert cost.cell_seconds == pytest.approx(1e-5, rel=1e-6)
    assert cost.for_cells(4, 60).c(8) < cost.c(8)
    # k sequences of one row against one of k rows (after 32 cells): the later rows' 10 us a cell aside, 2 ms each
    k = min(4, n_seq_max)
    assert cost.seq_seconds == pytest.approx(2e-3 - 1e-5 * k / 2, rel=1e-6)
    assert engine.ctx.cache.n_used() == 0  # the calibration leaves no cell behind
    round_cost = cost.for_cells(4, 60)
    t4, t3 = cost._t(4), cost._t(3)
    assert round_cost.seq_share() == pytest.approx((t4 - t3 + cost.seq_seconds) / t4)
    assert cost.for_cells(1, 60).seq_share() == 0.0  # a slot alone saves nobody anything by leaving


@pytest.mark.parametrize("temp", [0.0, 0.9])
def test_budgeted_slots_that_rest_equal_running_alone(engine, temp):
    alone = [tokens(_run(engine, p, [], temp=temp, seed=s, tree_nodes=0)) for s, p in enumerate(PROMPTS)]
    for seq in list(engine.slots):
        engine.release(seq)
    from engine.cost.curve import CostModel

    # settings of this test alone (the next test's engine forgets them): every slot rests between probe rounds,
    # the path under test on every round; and rows that cost nothing, by a curve that no timing replaces: the
    # tiny model's forwards take a millisecond, and balances measured on them move by more than a row costs,
    # which would make the probes' drafts refused
    engine.budget.state.rest_after = 0
    engine.budget.policy.cost = CostModel(sizes=[1, 32], seconds=[1.0, 1.0], min_seen=10**9)
    for s, p in enumerate(PROMPTS):
        engine.start(p, GenParams(max_new_tokens=40, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=s),
                                  spec=SpecParams(types=NGRAM_CHAIN + ["draft-simple"], n_max=12, adaptive=True,
                                                  p_min=0.0, tree_nodes=12)), seq=s)
    got, why = {s: [] for s in range(3)}, []
    while engine.active():
        for e in engine.step():
            got[e.seq].extend(e.emitted)
            why.append(e.budget_why or "")
    assert [got[s] for s in range(3)] == alone  # the same text, and at temp > 0 the same draws, as alone
    assert any("rests" in w for w in why), "no slot rested"
    # the tiny models' greedy text repeats, so the n-grams' probes find drafts; sampled text may give them none
    assert temp > 0 or any("rows" in w for w in why), "no draft verified"


def test_each_generation_is_measured_against_plain_decoding_from_its_start(engine):
    params = GenParams(max_new_tokens=12, ignore_eos=True, sampling=SamplerParams(temp=0.0, seed=0),
                       spec=SpecParams(types=NGRAM_CHAIN, n_max=8, adaptive=True, p_min=0.0, tree_nodes=8))
    prompt = PROMPTS[0]
    engine.start(prompt, params, seq=0)
    events = []
    while engine.active():
        events += engine.step()
    state = engine.budget.state
    assert state.records[0].balance is not None  # its rounds were settled against plain decoding
    assert [e.balance for e in events if e.balance is not None][-1] == state.records[0].balance  # the UI's figure
    engine.start(prompt, params, seq=0)  # the next turn in the same slot, not released in between
    assert state.records[0].balance is None
    engine.release(0)


def test_budgeted_trees_are_plain_decoding(engine):
    for seed, prompt in enumerate(PROMPTS):
        params = GenParams(max_new_tokens=40, ignore_eos=True, sampling=SamplerParams(temp=0.0, seed=seed),
                           spec=SpecParams(types=NGRAM_CHAIN + ["draft-simple"], n_max=12, adaptive=True,
                                           p_min=0.0, tree_nodes=12))
        events = list(engine.generate(prompt, params))
        assert tokens(events) == tokens(_run(engine, prompt, [], seed=seed, tree_nodes=0))
        assert any(e.budget_why for e in events if e.kind != "prefill")


def test_beside_a_slot_that_cannot_pay_for_a_row_no_slot_drafts(engine):
    """A slot that drafts nothing this round and stands below one row's cost against plain decoding makes the
    fair budget refuse every node: the others do not draft for nothing, and say why. Once it is ahead, they do."""
    from engine.cost.curve import CostModel

    # every row costs a whole forward (this test's curve: the next test's engine forgets it)
    engine.budget.policy.cost = CostModel(sizes=[1, 2, 32], seconds=[1.0, 2.0, 32.0])
    state = engine.budget.state
    drafting = SpecParams(types=NGRAM_CHAIN, n_max=8, adaptive=True, p_min=0.0, tree_nodes=8)
    engine.start(PROMPTS[0] * 3, GenParams(max_new_tokens=12, ignore_eos=True, spec=drafting), seq=0)
    engine.start(PROMPTS[1], GenParams(max_new_tokens=12, ignore_eos=True, spec=SpecParams(types=[])), seq=1)
    engine.step()  # the prefills
    calls = engine.chain.stats["ngram-simple"].n_call_draft
    events = {e.seq: e for e in engine.step()}
    assert engine.chain.stats["ngram-simple"].n_call_draft == calls  # nobody drafted
    assert events[0].kind == "plain" and "slot 1 drafts nothing this round" in events[0].budget_why
    state.records.of(1).balance = 5.0  # slot 1 is well ahead of plain decoding: it can pay for rows
    engine.step()
    assert engine.chain.stats["ngram-simple"].n_call_draft == calls + 1
    # slot 1 behind again, but wanting more tokens than slot 0: slot 0 leaves first, and what it gains may
    # pay slot 1 for its rows (the budget decides), so it drafts
    engine.release(1)
    engine.start(PROMPTS[1], GenParams(max_new_tokens=40, ignore_eos=True, spec=SpecParams(types=[])), seq=1)
    engine.step({1})  # its prefill
    state.records.of(1).balance = 0.0
    engine.step()
    assert engine.chain.stats["ngram-simple"].n_call_draft == calls + 2


def test_beside_other_slots_a_round_drafted_for_nothing_counts_as_refused(engine):
    from types import SimpleNamespace

    from engine.draft.base import DraftRequest

    state = engine.budget.state
    slots = [SimpleNamespace(seq=seq, replay=None, tokens=[1, 2, 3]) for seq in (5, 6)]

    def offer_nothing(tree_max):
        return {s.seq: DraftRequest(seq=s.seq, prompt=s.tokens, id_last=4, n_max=8, n_min=0, p_min=None,
                                    tree_max=tree_max) for s in slots}

    for n in (1, 2):
        assert engine.budget.slots.choose_nodes(slots, offer_nothing(8)) is None
        assert state.records[5].refused == state.records[6].refused == n
    state.n_rounds = 4 * state.probe_max + 1  # not a probe round of any interval
    assert state.rests(5) and state.rests(6)  # two rounds drafted for nothing: both rest
    engine.budget.slots.choose_nodes(slots, offer_nothing(0))  # a chain round, outside the budget: not counted
    assert state.records[5].refused == 2
    engine.budget.slots.choose_nodes(slots[:1], offer_nothing(8))  # alone, a slot never rests: not counted either
    assert state.records[5].refused == 2


def test_a_slot_that_leaves_early_pays_the_slots_it_leaves_for_its_rows():
    """Beside an open slot with no tree and no balance, a copying slot that wants fewer tokens gets its sure
    chain where a sequence costs more of a forward than a row: each token it gains is a forward earlier that the
    open slot runs without it. Not where the open slot leaves first, nor where a sequence costs only its row."""
    from engine.budget.tree_budget import SlotLedger, choose_nodes
    from engine.cost.curve import CostModel

    sure = ([5, 6, 7, 8], [0.95, 0.9, 0.85, 0.8])

    def offer(seq_seconds, remaining):
        # t(1) = 1, each further row 0.1; a sequence 0.1 more than a row where seq_seconds says so
        curve = CostModel(sizes=[1, 2, 32], seconds=[1.0, 1.1, 4.1], seq_seconds=seq_seconds)
        return choose_nodes({0: _scored([sure])}, 2, curve.for_cells(2, 0), SlotLedger(probe_every=100), bare=[1],
                    remaining=remaining).kept[0]

    assert offer(0.1, {0: 10, 1: 50}) == [0, 1, 2, 3]  # share 0.2 / 1.1 of a forward per token: it pays
    assert offer(0.1, None) == []  # nothing known about who leaves first: the open slot's balance alone
    assert offer(0.1, {0: 50, 1: 10}) == []  # the open slot leaves first: the copying slot's gain is not its own
    assert offer(0.0, {0: 10, 1: 50}) == []  # a sequence costs a row: a 95% node gives back 95% of its row


def test_a_model_drafter_that_finds_nothing_new_stops_drafting_and_probes():
    from engine.budget.gate import DrafterGate, GateParams, exclusive_gains

    # the head had the kept path's 3 tokens, an n-gram drafter the first 2 of them: the head alone found 1
    assert exclusive_gains({"draft-head": (4, 3), "ngram-simple": (2, 2), "ngram-mod": (1, 0)}, 3) == \
        {"draft-head": 1, "ngram-simple": 0, "ngram-mod": 0}
    gate = DrafterGate(GateParams(decay=0.5, prior_gain=1.0, probe_every=3))
    decisions = {0: [], 2: []}
    for i in range(12):
        for seq in (0, 2) if i >= 1 else (0,):  # slot 2 starts a round later
            go = gate.pays(seq, "draft-head")
            decisions[seq].append(go)
            if go:
                gate.note_cost(seq, "draft-head", 0.004)
                gate.note_gain(seq, "draft-head", 0)  # 4 ms of drafting for nothing the n-grams had not found
        gate.note_round(0.030, 3)  # 10 ms a token
    assert decisions[0][:2] == [True, True]
    # probes: every third round at first, then twice as seldom after each that found nothing (rounds 3 and 6)
    assert [i for i, go in enumerate(decisions[0]) if go and i >= 2] == [3, 6]
    # the other slot probes on the same rounds, so one batched call serves both
    probes = [i for i, go in enumerate(decisions[0]) if go and i >= 2]
    assert probes == [i + 1 for i, go in enumerate(decisions[2]) if go and i >= 2]
    assert gate.records[0].estimates[("draft-head", False)].period == 12
    assert gate.pays(0, "draft-head")  # round 12: a probe, and this time the head finds 2 tokens
    gate.note_cost(0, "draft-head", 0.004)
    gate.note_gain(0, "draft-head", 2)
    assert gate.records[0].estimates[("draft-head", False)].period == 3  # it pays again: probes every third round
    assert gate.pays(1, "draft-head")  # another slot has its own estimate
    for _ in range(8):  # a slot where the head finds 2 tokens a round pays its 4 ms
        assert gate.pays(1, "draft-head")
        gate.note_cost(1, "draft-head", 0.004)
        gate.note_gain(1, "draft-head", 2)
    gate.note_cost(1, "draft-head", 0.004)  # a round whose drafts the budget refused gains nothing
    gate.pays(1, "draft-head")
    assert gate.records[1].estimates[("draft-head", False)].gain < 2
    assert "ms drafting" in gate.why(1, "draft-head")
    gate.forget(1)
    assert not gate.records[1].estimates


def test_a_new_answer_beside_others_starts_from_what_the_drafter_gave_earlier_answers_at_that_many_slots():
    from engine.budget.gate import DrafterGate, GateParams

    gate = DrafterGate(GateParams(decay=0.5, probe_every=4, probe_max=16, seed_after=4))
    gate.crowd = 4
    for i in range(12):  # four answers beside each other: the head finds nothing the n-grams had not
        for seq in range(4):
            if gate.pays(seq, "draft-head"):
                gate.note_cost(seq, "draft-head", 0.005)
                gate.nothing_kept(seq)  # the budget refused its nodes
        gate.note_round(0.040, 4)  # 10 ms a token
    seed = gate.by_crowd[("draft-head", False, 4)]
    assert seed.n >= 4 and seed.gain * 0.010 < seed.cost and seed.period > 4
    for seq in range(4):
        gate.forget(seq)
    gate.n_rounds += -gate.n_rounds % seed.period + 1  # not a probe round
    # a new answer at four slots does not draft from its first round; it probes on the rounds the earlier
    # answers' probes had come to
    assert not gate.pays(7, "draft-head")
    assert gate.records[7].estimates[("draft-head", False)].period == seed.period
    assert "ms drafting" in gate.why(7, "draft-head")
    # alone, an answer drafts and measures from its first round
    gate.crowd = 1
    assert gate.pays(8, "draft-head")


def test_beside_slots_nobody_has_measured_a_model_drafter_starts_on_the_probe_rounds():
    from engine.budget.gate import DrafterGate, GateParams

    gate = DrafterGate(GateParams(decay=0.5, prior_gain=1.0, probe_every=4))
    gate.crowd = 2
    gate.note_round(0.020, 2)  # 10 ms a token
    drafted = {"draft-head": [], "n-grams": []}
    for i in range(1, 9):
        for name, cheap in (("draft-head", False), ("n-grams", True)):
            if gate.pays(0, name, cheap=cheap):
                drafted[name].append(i)
                gate.note_cost(0, name, 0.004)
                gate.note_gain(0, name, 0)
        gate.note_round(0.020, 2)
    assert drafted["draft-head"][0] == 4  # its first draft is the first probe round, not round 1
    # each probe found nothing, and no prior of one token a round stood beside them: twice as seldom each time
    assert drafted["draft-head"] == [4, 8] and gate.records[0].estimates[("draft-head", False)].gain == 0.0
    assert gate.records[0].estimates[("draft-head", False)].period == 16
    # the n-grams cost microseconds: they draft from the first round, their estimate starting from the prior
    assert drafted["n-grams"][:2] == [1, 2]
    assert "probe rounds" in DrafterGate(crowd=2).why(0, "draft-head")
    # a probe that finds tokens worth its time: the drafter drafts every round from there
    gate2 = DrafterGate(GateParams(decay=0.5, probe_every=4))
    gate2.crowd = 2
    gate2.note_round(0.020, 2)
    went = []
    for i in range(1, 9):
        if gate2.pays(0, "draft-head"):
            went.append(i)
            gate2.note_cost(0, "draft-head", 0.004)
            gate2.note_gain(0, "draft-head", 2)  # 20 ms of tokens for 4 ms
        gate2.note_round(0.020, 2)
    assert went == [4, 5, 6, 7, 8]


def test_the_gate_charges_a_drafter_the_forward_rows_its_nodes_took():
    from engine.budget.gate import DrafterGate, GateParams

    def rounds(gate, seq, n_rows):
        for _ in range(6):
            if gate.pays(seq, "draft-head"):
                gate.note_cost(seq, "draft-head", 0.004)  # 4 ms of drafting
                gate.note_rows(seq, "draft-head", n_rows)
                gate.note_gain(seq, "draft-head", 1)  # one token a round that nobody else found
            gate.note_round(0.030, 3)  # 10 ms a token
        return gate.records[seq].estimates[("draft-head", False)]

    gate = DrafterGate(GateParams(decay=0.5, probe_every=100))
    gate.row_seconds = 0.002
    # 10 ms of gain against 4 ms drafting and 2 rows of 2 ms: it pays
    assert abs(rounds(gate, 0, 2).cost - 0.008) < 1e-9 and gate.pays(0, "draft-head")
    # against 4 ms drafting and 4 rows of 2 ms it does not, though its drafting alone would
    assert abs(rounds(gate, 1, 4).cost - 0.012) < 1e-9 and not gate.pays(1, "draft-head")
    assert "drafting and rows" in gate.why(1, "draft-head")


def test_the_gate_keeps_rounds_the_ngrams_cover_apart():
    from engine.budget.gate import DrafterGate, GateParams

    # on a copied passage: where the n-grams guess the next token the head finds nothing more, where they guess
    # nothing it finds 2 tokens; it should keep drafting the second kind only
    gate = DrafterGate(GateParams(decay=0.5, probe_every=100))
    drafted = {True: [], False: []}
    for i in range(20):
        covered = i % 2 == 0
        go = gate.pays(0, "draft-head", p_covered=0.9 if covered else 0.1)
        drafted[covered].append(go)
        if go:
            gate.note_cost(0, "draft-head", 0.004)
            gate.note_gain(0, "draft-head", 0 if covered else 2)
        gate.note_round(0.030, 3)
    assert all(drafted[False]) and not any(drafted[True][5:])
    assert not gate.pays(0, "draft-head", p_covered=0.9) and "already guess" in gate.why(0, "draft-head")


def test_a_resting_slot_probes_with_the_ngram_drafters_only():
    from engine.draft.base import DraftRequest, Drafter
    from engine.draft.chain import DrafterChain
    from engine.draft.registry import make_drafter
    from engine.cost.curve import CostModel
    from engine.budget.draft_budget import DraftBudget
    from engine.budget.reports import learn_from_draft

    class Network(Drafter):  # stands for the draft head: a drafter whose every call runs a network
        name = "net"
        needs_model = True
        calls: list[list[int]] = []

        def draft(self, requests):
            self.calls.append([r.seq for r in requests])

    prompt = list(range(10, 30)) * 2 + [10, 11, 12]
    ngrams = make_drafter("ngram-simple", params=SMALL_NGRAMS["ngram-simple"])
    chain, budget = DrafterChain({"ngram-simple": ngrams, "net": Network()}), DraftBudget(CostModel())
    for seq in (0, 1):
        budget.begin(seq, ["ngram-simple", "net"], True, ["net"])
        chain.begin(seq, prompt, ["ngram-simple", "net"])
    budget.open_round(2)
    budget.state.waking.add(1)  # slot 1 rests, and this is its probe round
    allowances = budget.allow([], {0: (4, 8), 1: (4, 8)}).allowances
    requests = [DraftRequest(seq=seq, prompt=prompt, id_last=13, n_max=4, n_min=0, p_min=None, tree_max=8,
                             probe=allowances[seq].probe, allowance=allowances[seq]) for seq in (0, 1)]
    chain.draft(requests)
    assert Network.calls == [[0]]  # the probing slot is left out of the network's call
    assert len(requests[1].tree) > 0  # and its n-gram drafter still looked: 10 11 12 13 -> 14
    learn_from_draft(budget.gate, budget.policy, budget.records.of(1), requests[1], {})
    assert any("rests" in why for why in budget.records[1].skipped)


def test_the_ngram_drafters_are_credited_what_they_found_even_where_the_head_found_it_too():
    """In the relay's order: the n-grams, first and cheap, are credited the kept tokens they proposed; the head
    only what it added beyond them. Credited only what nobody else found, the n-grams stopped wherever the head
    also read a repeated passage, and nobody drafted the copy once the head was gated off."""
    from engine.draft.registry import NGRAMS
    from engine.cost.curve import CostModel
    from engine.budget.draft_budget import DraftBudget
    from engine.budget.reports import credit_tree
    from engine.draft.tree import DraftTree

    budget = DraftBudget(CostModel())
    budget.begin(0, ["ngram-simple", "net"], True, ["net"])  # "net" stands for the draft head
    for name in (NGRAMS, "net"):  # both drafted this round
        budget.gate.pays(0, name, cheap=name == NGRAMS)
        budget.gate.note_cost(0, name, 0.001)
    tree = DraftTree()
    tree.add_chain([14, 15, 16], "ngram-simple")
    tree.add_chain([14, 15, 16, 17], "net")  # the same three tokens, then one more
    path = [0, 1, 2, 3]
    credit_tree(budget.gate, budget.records.of(0), 0, tree, len(path), tree.credit(path))
    estimates = budget.gate.records[0].estimates
    assert estimates[(NGRAMS, False)].n == 1 and estimates[("net", False)].n == 1
    # the mean of the prior (1 token) and this round: the n-grams' 3 tokens, the head's 1 beyond them
    assert estimates[(NGRAMS, False)].gain == pytest.approx(2.0)
    assert estimates[("net", False)].gain == pytest.approx(1.0)


def test_the_ngram_drafters_are_gated_as_one_where_their_nodes_gain_nothing():
    from engine.draft.base import DraftRequest
    from engine.draft.chain import DrafterChain
    from engine.draft.registry import NGRAMS, make_drafter
    from engine.budget.gate import GateParams
    from engine.cost.curve import CostModel
    from engine.budget.draft_budget import DraftBudget
    from engine.budget.reports import credit_tree, learn_from_draft
    from engine.draft.tree import DraftTree

    prompt = list(range(10, 30)) * 2 + [10, 11, 12]  # with 13 sampled, the n-grams find 14 15 16 ... every round
    names = ["ngram-simple", "ngram-map-k"]
    chain, budget = DrafterChain({n: make_drafter(n, params=SMALL_NGRAMS[n]) for n in names}), DraftBudget(CostModel())
    budget.gate.params = GateParams(decay=0.5, probe_every=4, probe_max=4)
    budget.begin(0, names, True, [])
    chain.begin(0, prompt, names)
    account = budget.records.of(0)

    def round_(kept: int) -> DraftRequest:
        allowance = budget.allow([], {0: (4, 8)}).allowances[0]
        r = DraftRequest(seq=0, prompt=prompt, id_last=13, n_max=4, n_min=0, p_min=None, tree_max=8,
                         allowance=allowance)
        chain.draft([r])
        learn_from_draft(budget.gate, budget.policy, account, r, {})
        if r.tree is not None and len(r.tree):
            budget.gate.row_seconds = 0.0002  # a fiftieth of the round per row
            path = [v for v in range(len(r.tree)) if r.tree.depth(v) < kept and r.tree.drafters[v] in names][:kept]
            credit_tree(budget.gate, account, 0, r.tree, len(path), r.tree.credit(path))
        budget.gate.note_round(0.010, 1 + kept)
        return r

    # both drafters propose the same continuation: weighed one by one, each would gain nothing of its own
    for _ in range(6):
        assert len(round_(kept=3).tree) > 0
    assert not account.skipped
    # open text: the target keeps none of their nodes, so their drafting stops but for probes
    drafted = [len(round_(kept=0).tree or DraftTree()) > 0 for _ in range(16)]
    stop = drafted.index(False)
    assert stop <= 6 and 1 <= sum(drafted[stop:]) <= 4  # then only probes, every 4th round
    assert any(why.startswith(NGRAMS) for why in account.skipped) or drafted[-1]
