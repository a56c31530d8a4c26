"""The thread governor: fewer threads while another process holds cores, all of them again once it leaves, and
no change where fewer threads would not help; a fixed count never moves. Timings are given, so the decisions are
tested on any machine."""

from engine.serve.threads import ThreadGovernor


def drive(gov: ThreadGovernor, ratio_at: dict[int, float], forwards: int, t0: float, dt: float = 0.01):
    """Run forwards whose time over the quiet time is ratio_at[threads]; (the counts used, the clock after)."""
    used, now = [], t0
    for _ in range(forwards):
        used.append(gov.n_threads)
        gov.observe(ratio_at[gov.n_threads] * 0.01, 0.01, now)
        now += dt * ratio_at[used[-1]]
    return used, now


def test_a_taken_core_moves_the_forwards_to_fewer_threads_and_back_when_it_is_free():
    gov = ThreadGovernor(n_max=2)
    used, now = drive(gov, {2: 1.0, 1: 1.8}, 200, 0.0)
    assert set(used) == {2}, "a quiet machine keeps every core"
    used, now = drive(gov, {2: 3.5, 1: 1.9}, 200, now)  # another busy process: two threads wait on each other
    assert used[-150:].count(1) > 140, "one thread, as soon as a window shows it"
    used, now = drive(gov, {2: 1.0, 1: 1.8}, 3000, now)  # it left: the next retry takes both cores back
    assert used[-100:] == [2] * 100
    assert "kept" in gov.switches[-1][2] or gov.switches[-1][1] == 2


def test_a_slow_machine_that_fewer_threads_would_not_help_keeps_them_all():
    gov = ThreadGovernor(n_max=2, backoff_s=30.0)
    used, _ = drive(gov, {2: 1.7, 1: 3.0}, 2000, 0.0)  # slower than calibrated, but not for want of a core
    trials = used.count(1)
    assert 0 < trials <= 3 * gov.window, "a trial now and then, never a switch"
    assert used[-1] == 2


def test_a_fixed_count_and_a_single_core_never_change():
    fixed = ThreadGovernor(n_max=2, fixed=True)
    assert drive(fixed, {2: 5.0}, 100, 0.0)[0] == [2] * 100
    one = ThreadGovernor(n_max=1)
    assert drive(one, {1: 5.0}, 100, 0.0)[0] == [1] * 100
    assert fixed.describe() == "2 threads (fixed)"
