"""`python -m engine.bench.dist` on its built-in tiny pair: rejection sampling matches the target's exact
distribution of short continuations, and the check catches a verification that is not exact."""

from engine.round import verify
from engine.bench import dist


def test_rejection_sampling_passes_the_distribution_check(capsys):
    assert dist.main([]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "plain sampling  TV" in out
    line = next(s for s in out.splitlines() if s.startswith("speculative"))
    n_rejection, n_spec = (int(w) for w in line.split("rejection sampling in ")[1].split(" verified")[0].split(" of "))
    assert n_rejection == n_spec > 0, "no round was verified by rejection sampling: the check would test nothing"


def test_a_residual_that_ignores_the_draft_fails_the_check(monkeypatch, capsys):
    # the correction drawn from p instead of norm(max(0, p - q)): tokens the draft already proposed get picked
    # twice over, and the output leans towards the draft
    monkeypatch.setattr(verify, "residual", lambda p, q: p)
    assert dist.main(["--no-plain"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_bad_arguments_exit_2_with_a_reason(capsys):
    for argv, why in ((["--temp", "0"], "--temp must be > 0"), (["--spec", "nope"], "unknown drafter"),
                      (["--samples", "0"], ">= 1"), (["--target", "/no/such/dir"], "not found")):
        assert dist.main(argv) == 2
        err = capsys.readouterr().err
        assert why in err, err


def test_trees_at_temperature_08_are_distributed_as_the_target():
    """draft-simple's chain drawn from q, verified as a tree by rejection sampling over the siblings
    (engine/round/tree_rejection.py): 2,000 two-token continuations against the exact distribution."""
    assert dist.main(["--tree-nodes", "8", "--temp", "0.8", "--length", "2", "--samples", "2000", "--no-plain"]) == 0


def test_a_tree_residual_that_ignores_the_draft_fails_the_check(monkeypatch, capsys):
    from engine.round import tree_rejection

    monkeypatch.setattr(tree_rejection, "residual", lambda p, q: p)
    assert dist.main(["--tree-nodes", "8", "--temp", "0.8", "--length", "2", "--samples", "2000", "--no-plain"]) == 1
    assert "FAIL" in capsys.readouterr().out
