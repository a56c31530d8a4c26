"""draft-mtp: a target's own multi-token-prediction layers (GLM-4 MoE, DeepSeek-V3's layout) draft what
transformers' MtpModel drafts on the same weights, round after round, chained one layer per step or one layer
reused; speculation with them is token-identical to plain decoding; a target without them is refused with the
reason."""

import pytest
import torch

from engine.draft.base import DraftRequest
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from fresh import forgetting
from tiny import load_tiny
from tiny_mtp import fewer_layers, save_tiny_mtp

PROMPTS = [[1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 10, 11, 12, 13, 14, 15, 16, 17], [1, 40, 41, 40, 41, 42]]
N_NEW = 24


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    two, _ = save_tiny_mtp(root / "two", seed=0, n_mtp=2, prompts=PROMPTS, train_steps=20)
    return {"two": two, "one": fewer_layers(two, root / "one", 1), "none": fewer_layers(two, root / "none", 0),
            "missing": fewer_layers(two, root / "missing", 0, declared=2)}


@pytest.fixture(scope="module")
def engines(dirs):
    return {k: Engine(load_tiny(dirs[k]), n_ctx=256, n_seq_max=2, calibrate=False) for k in ("one", "two")}


fresh_engines = forgetting("engines")


@pytest.fixture(scope="module")
def plain(engines):
    return [tokens(engines["two"].generate(p, GenParams(max_new_tokens=N_NEW, ignore_eos=True))) for p in PROMPTS]


def tokens(events) -> list[int]:
    return [t for e in events for t in e.emitted]


def spec_params(temp=0.0, seed=0, tree=0, n_max=4):
    return GenParams(max_new_tokens=N_NEW, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                     spec=SpecParams(types=["draft-mtp"], n_max=n_max, adaptive=False, p_min=0.0, tree_nodes=tree))


def reference_drafts(target, net, confirmed: list[int], n: int) -> list[int]:
    """transformers' MTP drafting after `confirmed` (its last token id_last): MtpModel.forward over the whole
    sequence with a fresh MtpCache, one token per layer; a single layer is then fed its own output and draft
    token back, recomputed from scratch for each further token (without a cache)."""
    from transformers.cache_utils import MtpCache

    ids = torch.tensor([confirmed])
    with torch.no_grad():
        h = target.model(ids[:, :-1], output_hidden_states=True).hidden_states[-1]
        cache = MtpCache(config=target.model.config.get_mtp_config())
        pos = torch.arange(1, len(confirmed))[None]
        out, _, _ = net(input_ids=ids[:, 1:], last_hidden_states=h, attention_mask=None, position_ids=pos,
                        mtp_cache=cache)
        drafts = out[0].tolist()
        if net.num_mtp_layers > 1:
            return drafts[:n]
        feats, toks = h, ids[:, 1:]
        while len(drafts) < n:
            g = net.forward_layer(0, feats, torch.arange(1, toks.shape[1] + 1)[None], None, input_ids=toks)
            feats = torch.cat([h, g[:, len(confirmed) - 2:]], 1)
            toks = torch.cat([ids[:, 1:], torch.tensor([drafts])], 1)
            g = net.forward_layer(0, feats, torch.arange(1, toks.shape[1] + 1)[None], None, input_ids=toks)
            drafts.append(int(net.shared_head(g[0, -1]).argmax()))
    return drafts


@pytest.mark.parametrize("layers", ["one", "two"])
def test_every_rounds_draft_is_transformers_mtp_drafting(engines, layers):
    engine = engines[layers]
    d = engine.drafter("draft-mtp")
    assert d.n_mtp == {"one": 1, "two": 2}[layers] and d.hidden_layers == (2,)
    seen = []
    real = d.draft

    def spy(requests):
        real(requests)
        seen.extend((r.prompt + [r.id_last], list(r.result), r.n_max) for r in requests)

    d.draft = spy
    try:
        for prompt in PROMPTS[:2]:
            list(engine.generate(prompt, spec_params(n_max=3)))
    finally:
        del d.draft
    assert len(seen) > 10
    for confirmed, drafted, n_max in seen:
        assert drafted == reference_drafts(engine.target, d.net, confirmed, len(drafted))
        assert len(drafted) == min(n_max, 3 if layers == "one" else 2)  # chained layers: a token each


@pytest.mark.parametrize("tree", [0, 8])
@pytest.mark.parametrize("layers", ["one", "two"])
def test_speculation_is_token_identical_to_plain_and_keeps_drafts(engines, plain, layers, tree):
    engine = engines[layers]
    accepted = 0
    for prompt, want in zip(PROMPTS, plain):
        events = list(engine.generate(prompt, spec_params(tree=tree)))
        assert tokens(events) == want
        accepted += sum(e.n_accepted for e in events if e.kind == "spec")
    assert accepted >= len(PROMPTS) * 4, "the trained MTP layers' drafts were hardly ever kept"


def test_two_slots_in_one_forward_equal_running_alone(engines, plain):
    engine = engines["two"]
    got = {0: [], 1: []}
    engine.start(PROMPTS[0], spec_params(), seq=0)
    engine.start(PROMPTS[1], spec_params(), seq=1)
    shared = False
    while engine.active():
        events = engine.step()
        shared = shared or any(e.kind == "spec" and e.batch_rows > 3 for e in events)
        for e in events:
            got[e.seq].extend(e.emitted)
    for seq in (0, 1):
        engine.release(seq)
    assert [got[0], got[1]] == plain[:2] and shared


def test_a_prompt_sharing_a_finished_answers_prefix_drafts_from_its_features(engines, plain):
    """The second prompt's prefix is the first's cached cells (seq_cp): its features come from the first."""
    engine = engines["two"]
    first = tokens(engine.generate(PROMPTS[0], spec_params(), seq=0))
    second = PROMPTS[0] + first[:6]
    want = tokens(engine.generate(second, GenParams(max_new_tokens=N_NEW, ignore_eos=True), seq=0))
    engine.release(0)
    list(engine.generate(PROMPTS[0], spec_params(), seq=0))
    copied = []
    d = engine.drafter("draft-mtp")
    real = d.seq_cp
    d.seq_cp = lambda src, dst, n: (copied.append((src, dst, n)), real(src, dst, n))
    try:
        events = list(engine.generate(second, spec_params(), seq=1))
        n_shared = copied[0][2] if copied else 0
        known = d.states[1].feat_tok[:n_shared].tolist()  # never forwarded for seq 1: from seq 0
    finally:
        del d.seq_cp
        engine.release(0)
        engine.release(1)
    assert first == plain[0] and tokens(events) == want
    assert copied and copied[0][:2] == (0, 1) and n_shared > 4 and known == second[:n_shared]


def test_sampling_uses_rejection_with_the_heads_q_and_is_reproducible(engines):
    engine = engines["two"]
    for seed, prompt in enumerate(PROMPTS[:1]):
        a, b = (list(engine.generate(prompt, spec_params(temp=0.8, seed=seed))) for _ in range(2))
        assert tokens(a) == tokens(b)
        spec = [e for e in a if e.kind == "spec"]
        assert spec and all(e.verify_mode == "rejection" for e in spec)
    d = engine.drafter("draft-mtp")
    engine.start(PROMPTS[0], GenParams(max_new_tokens=2, sampling=SamplerParams(temp=0.8)), seq=0)
    engine.step()
    r = DraftRequest(seq=0, prompt=PROMPTS[0][:-1], id_last=PROMPTS[0][-1], n_max=2, n_min=0, p_min=0.0,
                     want_q=True)
    d.draft([r])
    engine.release(0)
    assert len(r.result) == len(r.result_q) == 2
    for tok, q in zip(r.result, r.result_q):
        assert abs(float(q.sum()) - 1) < 1e-5 and q[tok] > 0 and int((q > 0).sum()) <= d.params.top_k


def test_trees_at_08_test_mtps_draws_by_rejection_sampling_and_repeat_for_a_seed(engines):
    """MTP's drafts drawn from q in a tree are verified by rejection sampling over the siblings
    (engine/round/tree_rejection.py): every try names draft-mtp with its q, and the same seed gives the same text."""
    engine, seed = engines["two"], 3
    events = list(engine.generate(PROMPTS[2], spec_params(temp=0.8, seed=seed, tree=8)))
    spec = [e for e in events if e.kind == "spec"]
    assert spec and all(e.verify_mode == "tree" for e in spec)
    tries = [t for e in spec for t in e.tree_tries]
    assert tries and all(drafter == "draft-mtp" and 0 < q <= 1 for _, _, drafter, _, q, _ in tries)
    assert tokens(events) == tokens(engine.generate(PROMPTS[2], spec_params(temp=0.8, seed=seed, tree=8)))


def test_a_target_without_mtp_layers_is_refused_with_the_reason(dirs):
    none = Engine(load_tiny(dirs["none"]), n_ctx=64, n_seq_max=1, calibrate=False)
    with pytest.raises(ValueError, match="declares none"):
        none.drafter("draft-mtp")
    missing = Engine(load_tiny(dirs["missing"]), n_ctx=64, n_seq_max=1, calibrate=False)
    with pytest.raises(ValueError, match="holds no tensors model.layers.2"):
        missing.drafter("draft-mtp")


def test_the_bench_lists_it_and_the_arena_ranks_it_or_says_why_not(engines, dirs, capsys):
    from engine.bench.cli import parse_args
    from engine.bench.contest import ArenaParams, engine_runner, run_arena, why_not
    from engine.bench.leaderboard import leaderboard

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "draft-mtp" in capsys.readouterr().out
    engine = engines["two"]
    result = run_arena(engine_runner(engine), PROMPTS[:1], engine.target, None,
                       ArenaParams(n_max=3, max_new_tokens=12, ignore_eos=True))
    rows = {r["drafter"]: r for r in leaderboard(result)}
    assert "draft-mtp" in rows and all(r["lossless"] == "True" for r in rows.values())
    assert float(rows["draft-mtp"]["tokens_per_forward"]) > 1.0
    assert "draft-mtp" in next(e.contender for e in result.entries if e.contender.name == "chain").types
    assert why_not("draft-mtp", load_tiny(dirs["none"]), None) == "the target has no MTP layers (its config declares none)"
