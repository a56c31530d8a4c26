"""The page's "Same distribution?" check (engine/bench/samedist.py): the chi-square test itself, lossless paths
that pass it over 2,000 draws (1,000 a side) on the tiny pair (a chain by rejection sampling, a tree by rejection sampling
over the siblings), and a verifier that accepts every draft, which fails it."""

from collections import Counter

import pytest

from engine.bench import samedist
from engine.bench.samedist import SameDistPlan, chi2_homogeneity, compare, engine_runner
from engine.draft.draft_model import DraftModelParams
from engine.draft.registry import NGRAM_CHAIN
from engine.params import GenParams, SpecParams
from engine.round import verify
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from fresh import forgetting

N = 1000  # a side: 2,000 draws in all


@pytest.fixture(scope="module")
def pair_engine(tmp_path_factory):
    from engine.bench.tiny_pair import PROMPT, build_pair
    from engine.load.models import load_model

    target_dir, draft_dir = build_pair(tmp_path_factory.mktemp("pair"))
    target, draft = load_model(str(target_dir)), load_model(str(draft_dir))
    engine = Engine(target, draft=draft, n_ctx=8 * 64, n_seq_max=8, calibrate=False,
                    drafter_params={"draft-simple": DraftModelParams(n_seq_max=8)})
    return engine, target.encode(PROMPT)


fresh_engines = forgetting("pair_engine")


def params(types, tree_nodes=0) -> GenParams:
    return GenParams(sampling=SamplerParams(temp=0.8),
                     spec=SpecParams(types=list(types), n_max=3, adaptive=False, p_min=0.0, tree_nodes=tree_nodes))


def test_the_chi_square_test_by_hand():
    # 2 x 2: expected 60/40 on each side; chi2 = 2 * 100/60 + 2 * 100/40 = 8.333, 1 dof, p = 0.00389
    chi2, dof, p = chi2_homogeneity(Counter({1: 50, 2: 50}), Counter({1: 70, 2: 30}))
    assert chi2 == pytest.approx(25 / 3) and dof == 1 and p == pytest.approx(0.003892, rel=1e-3)
    assert chi2_homogeneity(Counter({1: 40, 2: 60}), Counter({1: 40, 2: 60}))[2] == pytest.approx(1.0)
    # rare tokens pool into one category: 3 and 4 are expected under 5 times a side
    assert chi2_homogeneity(Counter({1: 50, 2: 45, 3: 3, 4: 2}), Counter({1: 50, 2: 45, 3: 2, 4: 3}))[1] == 2
    assert chi2_homogeneity(Counter({7: 10}), Counter({7: 12})) == (0.0, 0, 1.0)
    with pytest.raises(ValueError, match="at least one draw"):
        chi2_homogeneity(Counter(), Counter({1: 3}))


@pytest.mark.parametrize("types,tree_nodes", [(["draft-simple"], 0), (NGRAM_CHAIN + ["draft-simple"], 8)],
                         ids=["chain", "tree"])
def test_lossless_paths_pass(pair_engine, types, tree_nodes):
    engine, prompt = pair_engine
    report = compare(engine_runner(engine), prompt, params(types, tree_nodes), SameDistPlan(n=N, width=8))
    assert sum(report.spec.values()) == sum(report.plain.values()) == N
    assert report.n_verified == N and 0 < report.n_accepted < N  # every compared token was a verification's
    assert report.dof >= 3 and report.p_value > 0.01, report


def test_a_verifier_that_accepts_every_draft_fails(pair_engine, monkeypatch):
    def accept_all(sampler, logits, draft, q, allowed=None, residual_shown=0):
        tok = sampler.sample_probs(sampler.probs(logits[len(draft)]))
        return verify.Verdict(tokens=list(draft) + [tok], n_accepted=len(draft), p_target=[1.0] * (len(draft) + 1),
                              p_draft_rows=[1.0] * len(draft))

    monkeypatch.setattr(verify, "rejection", accept_all)
    engine, prompt = pair_engine
    report = compare(engine_runner(engine), prompt, params(["draft-simple"]), SameDistPlan(n=N, width=8))
    assert report.n_accepted == N and report.p_value < 0.001, report


def test_bad_plans_are_refused(pair_engine):
    engine, prompt = pair_engine
    with pytest.raises(ValueError, match="temperature above 0"):
        compare(engine_runner(engine), prompt, GenParams(), SameDistPlan(n=10))
    with pytest.raises(ValueError, match=">= 1"):
        compare(engine_runner(engine), prompt, params(["draft-simple"]), SameDistPlan(n=10, position=0))
    assert samedist.SEED_GAP > 10_000  # the sides' seeds never meet for any page-sized N
