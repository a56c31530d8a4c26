"""What a round that verifies drafts costs in service, against the calibrated curve (engine/cost/curve.py
`CostModel.step_fit`), and what the budget and the slots' balances make of it."""

from types import SimpleNamespace

import pytest

from engine.batch import Batch
from engine.budget.tree_budget import SlotLedger, choose_nodes
from engine.cost.curve import CostModel
from engine.serve.engine import Engine
from engine.draft.tree import DraftTree
from fresh import forgetting


@pytest.fixture(scope="module")
def engine(tiny_target):
    return Engine(tiny_target, n_ctx=256, n_seq_max=4, calibrate=False)


fresh_engines = forgetting("engine")


def _curve(**kw) -> CostModel:
    # t(1) = 1 s, each further row 0.1 s
    return CostModel(sizes=[1, 2, 32], seconds=[1.0, 1.1, 4.1], **kw)


def test_the_fit_starts_at_the_curve_and_finds_a_rounds_fixed_cost_and_its_rows_factor():
    cost = _curve()
    assert cost.step_fit() == pytest.approx((0.0, 1.0))  # nothing observed: the prior meets the curve exactly
    for rep in range(200):
        predicted = 1e-3 * (1 + rep % 7)  # rounds of 1 to 7 draft rows, 1 ms each by the curve
        cost.observe_step(predicted, 2e-3 + 1.5 * predicted)
    fixed, factor = cost.step_fit()
    assert fixed == pytest.approx(2e-3, rel=0.15) and factor == pytest.approx(1.5, rel=0.1)
    for _ in range(400):  # rows that cost nothing at all: the factor stops at its floor, not below
        cost.observe_step(4e-3, 0.0)
    assert cost.step_fit()[1] == 0.5


def test_a_rounds_rows_cost_the_curves_step_times_the_factor_plus_the_fixed_part_once():
    cost = _curve()
    for rep in range(300):
        predicted = 0.1 * (1 + rep % 5)  # in seconds: t(1) = 1 s here
        cost.observe_step(predicted, 0.05 + 2.0 * predicted)
    fixed, factor = cost.step_fit()
    round_cost = cost.for_cells(4, 0)
    assert round_cost.c(4) == pytest.approx(cost.c(4)) and round_cost.c(3) == pytest.approx(cost.c(3))
    assert round_cost.c(6) == pytest.approx(cost.c(4) + factor * (cost.c(6) - cost.c(4)) + fixed)
    assert round_cost.c(6) == pytest.approx(cost.c(4) + 2.0 * 0.2 + 0.05, rel=0.02)
    assert round_cost.step_seconds(6) == pytest.approx(0.2)  # what the curve says, without the fit


def test_a_deep_sure_chain_pays_a_fixed_cost_that_one_node_alone_does_not():
    """With a drafted round's fixed cost, the first node's row costs more than the next: the fair budget must
    look past it (a sure chain of 6 pays where its first node alone would not)."""
    cost = _curve()
    for rep in range(300):
        predicted = 0.1 * (1 + rep % 5)
        cost.observe_step(predicted, 0.5 + predicted)  # half a one-row forward each drafted round
    sure = DraftTree()
    sure.add_chain([5, 6, 7, 8, 9, 10], "x", scores=[0.98, 0.97, 0.96, 0.95, 0.94, 0.93])
    state = SlotLedger(probe_every=100)
    # the slot beside it can pay its share of a dearer forward
    state.records.of(0).balance, state.records.of(1).balance = 0.0, 10.0
    assert choose_nodes({0: sure}, 2, cost.for_cells(2, 0), state, bare=[1]).kept[0] == [0, 1, 2, 3, 4, 5]
    one = DraftTree()
    one.add_chain([5], "x", scores=[0.98])
    assert choose_nodes({0: one}, 2, cost.for_cells(2, 0), SlotLedger(probe_every=100), bare=[1]).kept[0] == []


def _budget(engine, cost):
    """The engine's budget on the curve `cost` for this test (the next test's engine forgets it: tests/fresh.py)."""
    engine.budget.policy.cost = cost
    return engine.budget


def test_the_round_observes_its_draft_rows_against_a_plain_rounds_forward_and_work_after_it(engine):
    from engine.budget.reports import observe_cost

    cost = _curve(min_seen=3)
    _budget(engine, cost)
    slots = [SimpleNamespace(seq=seq, replay=None, tokens=[1]) for seq in range(4)]
    plain = Batch()
    for seq in range(4):
        plain.add(7, 1, seq, True)
    for _ in range(3):
        cost.observe(4, 1.3)
        observe_cost(cost, None, plain, slots, 1.3, 0.004)  # 1 ms a slot after a plain forward
    assert cost.after_plain == pytest.approx(1e-3) and cost.n_after_plain == 3
    drafted = Batch()
    for seq in range(4):
        drafted.add(7, 1, seq, True)
        drafted.add(8, 2, seq, True)
    budget = SimpleNamespace(n_base=4, cost=cost.for_cells(4, 0))
    observe_cost(cost, budget, drafted, slots, 1.9, 0.010)
    # x: the curve's 4 rows beyond 4, 0.4 s; y: 0.6 s of forward beyond 1.3, and 6 ms of work beyond 4
    assert cost.step_sums[1] == pytest.approx(0.4) and cost.step_sums[2] == pytest.approx(0.606)


def test_a_slots_balance_is_charged_the_whole_round_against_a_whole_plain_round(engine):
    cost = _budget(engine, _curve(min_seen=3)).policy.cost
    slots = [SimpleNamespace(seq=seq, replay=None, tokens=[1]) for seq in range(4)]
    sb = engine.budget.slots
    # nothing timed: the calibrated forward of 4 rows (1.3 s), no work after it
    assert sb.cost_ratio(None, slots, whole=1.56) == pytest.approx(1.2)
    for _ in range(3):
        cost.observe(4, 0.04)
    assert sb.cost_ratio(None, slots, whole=0.066) == pytest.approx(0.066 / 0.04)
    for _ in range(3):
        cost.observe_after_plain(1e-3)
    assert sb.cost_ratio(None, slots, whole=0.066) == pytest.approx(0.066 / 0.044)
    replaying = slots[:3] + [SimpleNamespace(seq=3, replay=SimpleNamespace(tokens=[7, 8, 9]), tokens=[1])]
    # 6 base rows (a replay's 3), none timed: the curve's step up from the 4 rows timed stands for them
    assert sb.cost_ratio(None, replaying, whole=0.066) == pytest.approx(0.066 / (0.04 * 1.5 / 1.3 + 4e-3))
    # three sequences, and no forward of 3 rows timed: the curve's step down from the 4 rows timed
    assert sb.cost_ratio(None, slots[:3], whole=0.06) == pytest.approx(0.06 / (0.04 * 1.2 / 1.3 + 3e-3))


def test_a_slot_that_left_ahead_of_plain_decoding_stays_in_the_plain_round_the_others_are_measured_against(engine):
    """Plain decoding would run a slot that finished 2 rounds ahead for 2 more rounds beside the slots it left:
    their rounds are charged against a plain round with it, and only theirs (not a slot that came later)."""
    from engine.budget.slots import SlotTrees

    cost = _budget(engine, _curve(min_seen=3)).policy.cost
    sb = SlotTrees(engine.budget.policy, engine.budget.gate)
    sb.state.records.of(0).balance, sb.state.records.of(1).balance = 2.4, -0.5
    sb.leave(0, [0, 1, 2])
    sb.leave(1, [1, 2])  # behind plain decoding: nobody waits for it
    assert sb.ghosts_of(1) == 1 and sb.ghosts_of(2) == 1 and sb.ghosts_of(0) == 0 and sb.ghosts_of(3) == 0
    for _ in range(3):
        cost.observe(2, 1.1)
        cost.observe_after_plain(0.01)
    slots = [SimpleNamespace(seq=seq, replay=None, tokens=[1]) for seq in (1, 2)]
    # a round of the two slots left, 1.12 s: against the plain round of three it saves them the third's share
    assert sb.cost_ratio(None, slots, whole=1.12, ghosts=1) == pytest.approx(1.12 / (1.2 * 1.1 / 1.1 + 0.03))
    sb.begin(2)  # a new answer in slot 2 never shared a forward with slot 0
    assert sb.ghosts_of(2) == 0 and sb.ghosts_of(1) == 1
    sb.next_round()
    assert sb.ghosts_of(1) == 1
    sb.next_round()  # two rounds: slot 0 would have finished by now
    assert sb.ghosts_of(1) == 0


def test_the_budget_option_reaches_the_engine_from_the_app_and_the_bench(tiny_target, bench_prompts):
    """`--budget goodput` turns the fair budget off (the batch's goodput alone chooses the rows); fair by default.
    A copying slot's sure chain beside a slot with nothing to draft and no balance: refused when fair, kept with
    goodput alone, where the forward's rows pay for the batch."""
    import sys
    from pathlib import Path

    from engine.bench import cli
    from engine.bench.run import BenchConfig
    from ui.loader import make_runtime
    from ui.state import AppOptions

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import app

    for flag, fair in (([], True), (["--budget", "goodput"], False)):
        options = AppOptions(n_ctx=256, parallel=2, budget=app.parse_args(flag).budget)
        assert make_runtime(tiny_target, None, options).engine.budget.state.fair is fair
        a = cli.parse_args(["--prompts", str(bench_prompts)] + flag)
        engine = BenchConfig.from_args(a, n_max=8, parallel=2, ctx_len=0).build(tiny_target, None)
        assert engine.budget.state.fair is fair
        sure = DraftTree()
        sure.add_chain([5, 6, 7, 8], "x", scores=[0.95, 0.9, 0.85, 0.8])
        state = SlotLedger(probe_every=100, fair=fair)
        kept = choose_nodes({0: sure}, 2, _curve().for_cells(2, 0), state, bare=[1]).kept[0]
        assert kept == ([] if fair else [0, 1, 2, 3])
