"""draft-head: the EAGLE-style head reading the target's hidden states. Lossless, rolled back with the target,
several sequences at once, refused on another model; and the shipped head on the embedded model."""

import json
from pathlib import Path

import pytest
import torch

from engine.draft.registry import NGRAM_CHAIN
from engine.draft.head.drafter import DraftHeadDrafter, DraftHeadParams, head_fits
from engine.draft.head.net import DraftHead, HeadConfig, load_head, save_head, target_fingerprint
from engine.draft.head.tree import HeadTreeParams
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from training.unroll import step_loss, unroll
from fresh import forgetting

PROMPTS = [
    [1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6],
    [1, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
    [1, 40, 41, 40, 41, 40, 42, 43, 40, 41],
]
ROOT = Path(__file__).resolve().parent.parent


def tokens(events) -> list[int]:
    return [t for e in events for t in e.emitted]


def run(engine, prompt, types, temp=0.0, seed=0, n=40, n_max=4, rollback="auto", seq=None):
    params = GenParams(max_new_tokens=n, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                       spec=SpecParams(types=list(types), n_max=n_max, adaptive=False, p_min=0.0,
                                       rollback=rollback))
    return list(engine.generate(prompt, params, seq=seq))


def tiny_head(target, train_steps: int) -> DraftHead:
    """A head for the tiny target, briefly trained on the target's own greedy text so that it accepts often."""
    emb = target.model.get_input_embeddings().weight.detach()
    cfg = HeadConfig(hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, intermediate=64, layers=(0, 1, 2),
                     draft_vocab=48, target_vocab=64, rope_theta=10000.0, target_fingerprint=target_fingerprint(emb))
    torch.manual_seed(0)
    head = DraftHead(cfg)
    head.d2t.copy_(torch.arange(5, 53))
    head.attach_target(emb)
    if train_steps == 0:
        return head
    gen = torch.Generator().manual_seed(0)
    starts = torch.randint(5, 60, (16, 3), generator=gen)
    with torch.inference_mode():
        seqs = target.model.generate(torch.cat([torch.ones(16, 1, dtype=torch.long), starts], 1), max_new_tokens=40,
                                     do_sample=False, eos_token_id=None, pad_token_id=3)
        out = target.model(seqs, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[i] for i in cfg.layers], -1).clone()
    top = torch.softmax(out.logits.float(), -1).topk(4, dim=-1)
    head.feat_mu.copy_(feats.reshape(-1, feats.shape[-1]).mean(0))
    head.feat_sigma.copy_(feats.reshape(-1, feats.shape[-1]).std(0))
    t2d = torch.full((64,), -1, dtype=torch.long)
    t2d[head.d2t] = torch.arange(48)
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)
    valid = torch.ones(seqs.shape, dtype=torch.bool)
    for _ in range(train_steps):
        logits = unroll(head, feats, seqs.clone(), 2)
        loss = 0.0
        for j, lg in enumerate(logits):
            ids = torch.cat([top.indices[:, j:], torch.zeros_like(top.indices[:, :j])], 1)
            p = torch.cat([top.values[:, j:], torch.zeros_like(top.values[:, :j])], 1)
            l_sum, _, n = step_loss(lg, ids, p, t2d, valid)
            loss = loss + l_sum / n
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


@pytest.fixture(scope="module")
def head_file(tiny_target, tmp_path_factory):
    path = tmp_path_factory.mktemp("head") / "tiny.safetensors"
    save_head(tiny_head(tiny_target, train_steps=60), path)
    return path


@pytest.fixture(scope="module")
def engine(tiny_target, head_file):
    return Engine(tiny_target, n_ctx=512, n_seq_max=4, calibrate=False,
                  drafter_params={"draft-head": DraftHeadParams(weights=head_file)})


@pytest.mark.parametrize("types", [["draft-head"], NGRAM_CHAIN + ["draft-head"]])
def test_greedy_is_token_identical_and_the_head_accepts(engine, types):
    n_acc = 0
    for prompt in PROMPTS:
        events = run(engine, prompt, types)
        assert tokens(events) == tokens(run(engine, prompt, []))
        n_acc += sum(e.n_accepted for e in events if e.drafter == "draft-head")
    assert n_acc > 0, "the trained tiny head never had a token accepted"
    assert engine.ctx.hidden_layers == (0, 1, 2)


def test_sampling_uses_rejection_with_a_valid_q_and_is_reproducible(engine):
    for seed, prompt in enumerate(PROMPTS):
        a, b = run(engine, prompt, ["draft-head"], temp=0.8, seed=seed), run(engine, prompt, ["draft-head"],
                                                                            temp=0.8, seed=seed)
        assert tokens(a) == tokens(b)
        spec = [e for e in a if e.kind == "spec"]
        assert spec and all(e.verify_mode == "rejection" for e in spec)
    d = engine.pool["draft-head"]
    from engine.draft.base import DraftRequest
    r = DraftRequest(seq=0, prompt=PROMPTS[0], id_last=5, n_max=3, n_min=0, p_min=0.0, want_q=True)
    engine.start(PROMPTS[0] + [5], GenParams(max_new_tokens=2, sampling=SamplerParams(temp=0.8)), seq=0)
    engine.step()
    d.draft([r])
    assert len(r.result) == 3 and len(r.result_q) == 3
    for tok, q in zip(r.result, r.result_q):
        assert abs(float(q.sum()) - 1) < 1e-5 and q[tok] > 0 and float(q[:5].sum()) == 0.0  # outside d2t: 0
    engine.release(0)


def test_p_min_left_to_the_head_is_its_own_and_an_explicit_one_overrides_it(engine):
    from engine.draft.base import DraftRequest

    d = engine.drafter("draft-head")  # built before the prefill, which gives it the prompt's features
    engine.start(PROMPTS[1] + [5], GenParams(max_new_tokens=2), seq=0)
    engine.step()
    own = d.params.p_min

    def drafted(request_p_min):
        r = DraftRequest(seq=0, prompt=PROMPTS[1], id_last=5, n_max=3, n_min=0, p_min=request_p_min)
        d.draft([r])
        return r

    try:
        p_first = drafted(0.0).result_p[0]  # the head's top probability at the first draft position
        d.params.p_min = 0.0
        assert len(drafted(None).result) == 3
        d.params.p_min = p_first + 1e-6  # its own p_min now stops it before the first token
        assert drafted(None).result == []
        assert len(drafted(0.0).result) == 3  # the request's p_min wins over the drafter's own
    finally:
        d.params.p_min = own
        engine.release(0)
    assert SpecParams().p_min is None and own == DraftHeadParams().p_min
    with pytest.raises(ValueError, match="p_min"):
        SpecParams(p_min=1.5).validate()


@pytest.mark.parametrize("temp", [0.0, 0.8])
def test_forced_checkpoint_rollback_gives_the_same_text(engine, temp):
    """Restore + replay re-runs positions the head already has features for: idempotent. At temp > 0 the replay
    round samples its new token plainly where range removal decides it by rejection sampling (both exact), so
    there the check is that the checkpoint path reproduces itself."""
    n_replays = 0
    for seed, prompt in enumerate(PROMPTS):
        mode = "checkpoint" if temp > 0 else "auto"
        want = tokens(run(engine, prompt, ["draft-head"], temp=temp, seed=seed, rollback=mode))
        events = run(engine, prompt, ["draft-head"], temp=temp, seed=seed, rollback="checkpoint")
        assert tokens(events) == want
        n_replays += sum(e.kind == "replay" for e in events)
    assert n_replays > 0


def test_several_sequences_draft_in_one_batch(engine):
    alone = [tokens(run(engine, p, ["draft-head"])) for p in PROMPTS]
    for seq in list(engine.slots):
        engine.release(seq)
    params = GenParams(max_new_tokens=40, ignore_eos=True,
                       spec=SpecParams(types=["draft-head"], n_max=4, adaptive=False, p_min=0.0))
    slots = [engine.start(p, params, seq=i) for i, p in enumerate(PROMPTS)]
    got = {s.seq: [] for s in slots}
    calls0 = engine.chain.stats["draft-head"].n_call_draft
    rounds = 0
    while engine.active():
        for e in engine.step():
            got[e.seq].extend(e.emitted)
        rounds += 1
    assert [got[s.seq] for s in slots] == alone
    assert engine.chain.stats["draft-head"].n_call_draft - calls0 < 3 * rounds  # one call drafted for several
    for s in slots:
        engine.release(s.seq)


def test_trees_grown_for_several_sequences_at_once_are_the_trees_grown_alone(engine):
    from engine.draft.base import DraftRequest

    params = GenParams(max_new_tokens=40, ignore_eos=True, spec=SpecParams(types=["draft-head"], tree_nodes=8))
    slots = [engine.start(p, params, seq=i) for i, p in enumerate(PROMPTS)]
    for _ in range(3):  # the prefills, then rounds: the head has features and entries to attend to
        engine.step()
    head = engine.pool["draft-head"]
    shape = head.params.tree
    head.params.tree = HeadTreeParams(min_score=0.0)  # the tiny head is unsure of everything: expand anyway

    def trees(seqs):
        reqs = [DraftRequest(seq=s.seq, prompt=list(s.tokens), id_last=s.id_last, n_max=6, n_min=0, p_min=0.0,
                             tree_max=8) for s in slots if s.seq in seqs]
        head.draft(reqs)
        return [(r.result_tree.tokens, r.result_tree.parents, r.result_tree.scores) for r in reqs]

    together = trees({s.seq for s in slots})
    assert together == [trees({s.seq})[0] for s in slots]
    assert all(max(t[1]) >= 0 for t in together)  # real trees: more than one depth

    # nodes the last budget would not give a row (scored below its threshold) are not expanded: here none is
    reqs = [DraftRequest(seq=s.seq, prompt=list(s.tokens), id_last=s.id_last, n_max=6, n_min=0, p_min=0.0,
                         tree_max=8, tree_min_score=1.0) for s in slots]
    head.draft(reqs)
    for r, (tokens_, _, scores) in zip(reqs, together):
        assert r.result_tree.parents == [-1] * len(r.result_tree)  # the root's children only
        assert r.result_tree.scores == sorted(scores[:len(r.result_tree)], reverse=True)
    head.params.tree = shape
    for s in slots:
        engine.release(s.seq)


def test_a_tree_grows_no_depth_that_cannot_enter_it_and_is_the_tree_grown_in_full(engine, monkeypatch):
    from engine.draft.head import tree as head_tree
    from engine.draft.base import DraftRequest

    params = GenParams(max_new_tokens=40, ignore_eos=True, spec=SpecParams(types=["draft-head"], tree_nodes=8))
    slots = [engine.start(p, params, seq=i) for i, p in enumerate(PROMPTS)]
    for _ in range(3):
        engine.step()
    head = engine.pool["draft-head"]
    shape = head.params.tree
    head.params.tree = HeadTreeParams(min_score=0.0, branch=2)
    steps = []  # rows of each head step: the first (every sequence at id_last), then one per depth grown
    logits = head.head.logits
    monkeypatch.setattr(head.head, "logits", lambda g: steps.append(g.shape[0]) or logits(g))

    def trees(n_nodes):
        steps.clear()
        reqs = [DraftRequest(seq=s.seq, prompt=list(s.tokens), id_last=s.id_last, n_max=6, n_min=0, p_min=0.0,
                             tree_max=n_nodes) for s in slots]
        head.draft(reqs)
        return [(r.result_tree.tokens, r.result_tree.parents, r.result_tree.scores) for r in reqs], list(steps)

    for n_nodes in (1, 2, 3, 8):
        pruned, pruned_steps = trees(n_nodes)
        monkeypatch.setattr(head_tree, "_kth_score", lambda nodes, n: 0.0)  # expand every frontier node
        full, full_steps = trees(n_nodes)
        monkeypatch.undo()
        monkeypatch.setattr(head.head, "logits", lambda g: steps.append(g.shape[0]) or logits(g))
        assert pruned == full
        assert sum(pruned_steps) <= sum(full_steps)
        if n_nodes == 1:  # the best of the root's children is the tree: the first step alone
            assert len(pruned_steps) == 1 and len(full_steps) > 1
    head.params.tree = shape
    for s in slots:
        engine.release(s.seq)


def test_a_prompts_prefill_makes_the_heads_entries_and_the_first_draft_is_the_one_made_lazily(engine):
    from engine.draft.base import DraftRequest

    prompt = [1] + [20 + i % 7 for i in range(23)]  # 24 rows: more than prefill_rows
    params = GenParams(max_new_tokens=8, ignore_eos=True, spec=SpecParams(types=["draft-head"], tree_nodes=6))
    trees, entries = [], []
    for prefill_rows in (10**9, 16):  # lazily, in the first draft, then at the prefill
        slot = engine.start(prompt, params, seq=0)
        head = engine.pool["draft-head"]
        head.params.prefill_rows = prefill_rows
        engine.step()  # the prefill
        entries.append(list(head._state(0).kv_tokens))
        r = DraftRequest(seq=0, prompt=list(slot.tokens), id_last=slot.id_last, n_max=4, n_min=0, p_min=0.0,
                         tree_max=6)
        head.draft([r])
        trees.append((r.result_tree.tokens, r.result_tree.parents, r.result_tree.scores))
        engine.release(0)
    head.params.prefill_rows = DraftHeadParams().prefill_rows
    assert entries == [[], prompt]
    assert trees[0] == trees[1] and len(trees[0][0]) > 0


def test_beside_other_slots_the_heads_tree_is_one_node_more_than_the_budget_last_kept(engine, monkeypatch):
    params = GenParams(max_new_tokens=24, ignore_eos=True,
                       spec=SpecParams(types=NGRAM_CHAIN + ["draft-head"], tree_nodes=8))
    engine.start(PROMPTS[0], params, seq=0)
    head = engine.pool["draft-head"]
    engine.release(0)
    seen = []  # (crowd, seq, model_tree_max, head nodes drafted, model nodes the budget kept the round before)
    draft = head.draft
    # the tiny model's forward is cheaper than a round's drafting and bookkeeping: charged honestly, the slots
    # stand below plain decoding from their first rounds and the fair budget lets nobody draft. The cap is what
    # this test is about; the budget's goodput alone still decides the nodes
    monkeypatch.setattr(engine.budget.state, "fair", False)
    # and the gate must let the head draft in these short answers: it probes every round
    monkeypatch.setattr(engine.budget.gate.params, "probe_every", 1)

    def recording(requests):
        before = {seq: record.model_nodes for seq, record in engine.budget.state.records.items()}
        draft(requests)
        for r in requests:
            if r.tree_max > 0:
                seen.append((engine.budget.gate.crowd, r.seq, r.model_tree_max, len(r.result_tree),
                             before.get(r.seq, 0), r.tree_max))

    monkeypatch.setattr(head, "draft", recording)
    for n_slots in (1, 3):
        seen.clear()
        for i in range(n_slots):
            engine.start(PROMPTS[i], params, seq=i)
        while engine.active():
            engine.step()
        for i in range(n_slots):
            engine.release(i)
        assert seen
        for crowd, seq, cap, n_nodes, kept_before, tree_max in seen:
            if crowd == 1:
                assert cap == 0  # alone: the tree the head's own rules grow
            else:
                assert cap == min(tree_max, 1 + kept_before) and n_nodes <= cap
        assert any(crowd > 1 for crowd, *_ in seen) == (n_slots > 1)


def test_a_shared_prompt_prefix_brings_its_features_to_the_head(engine):
    """A slot whose prompt prefix another slot holds gets the cells by seq_cp and never forwards them; the head
    must get the target features of those positions too, or it drafts from zeros there."""
    shared = PROMPTS[0] + [20, 21, 22, 23, 24, 25]
    second = shared + [30, 31]
    alone = tokens(run(engine, second, ["draft-head"]))
    for seq in list(engine.slots):
        engine.release(seq)
    params = GenParams(max_new_tokens=40, ignore_eos=True,
                       spec=SpecParams(types=["draft-head"], n_max=4, adaptive=False, p_min=0.0))
    first = engine.start(shared, params, seq=0)
    engine.step({first.seq})  # the prefill: the shared prefix is in the cache and its features in the head
    drafter = engine.pool["draft-head"]
    slot = engine.start(second, params, seq=1)
    assert len(slot.tokens) == len(shared)  # taken from slot 0, not forwarded
    got = drafter.states[1]
    assert got.feat_tok[:len(shared)].tolist() == shared
    assert torch.equal(got.feats[:len(shared)], drafter.states[0].feats[:len(shared)])
    out = []
    while engine.active({1}):
        for e in engine.step({1}):
            out.extend(e.emitted)
    assert out == alone
    for seq in list(engine.slots):
        engine.release(seq)


def test_a_head_for_another_model_is_refused(tiny_target, tiny_dirs, head_file, tmp_path):
    from tiny import load_tiny

    other = load_tiny(tiny_dirs["draft"])  # same vocabulary and width, other weights
    e = Engine(other, n_ctx=64, n_seq_max=1, calibrate=False,
               drafter_params={"draft-head": DraftHeadParams(weights=head_file)})
    with pytest.raises(ValueError, match="another model"):
        e.drafter("draft-head")
    cfg = json.loads(head_file.with_suffix(".json").read_text())
    cfg["target_vocab"] = 128
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(head_file.read_bytes())
    bad.with_suffix(".json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="vocab 128"):
        DraftHeadDrafter(target=tiny_target, params=DraftHeadParams(weights=bad))
    with pytest.raises(ValueError, match="not found"):
        DraftHeadDrafter(target=tiny_target, params=DraftHeadParams(weights=tmp_path / "none.safetensors"))
    # what the UI asks before putting draft-head in a chain: the same answers, from the config alone
    assert head_fits(tiny_target, head_file)
    assert not head_fits(other, head_file) and not head_fits(tiny_target, bad)
    assert not head_fits(tiny_target, tmp_path / "none.safetensors")


def test_saved_head_loads_back_the_same(tiny_target, head_file):
    head = load_head(head_file)
    assert head.cfg.layers == (0, 1, 2) and head.d2t.tolist() == list(range(5, 53))


# ---- the shipped head on the embedded model ---------------------------------------------------------------

@pytest.fixture(scope="module")
def embedded_engine(embedded):
    return Engine(embedded, n_ctx=2048, n_seq_max=1, calibrate=False)


fresh_engines = forgetting("engine", "embedded_engine")


@pytest.fixture(scope="module")
def embedded_plain(embedded, embedded_engine):
    """Three held-out prompts (two open, one copy) and plain decoding's answers to them."""
    rows = [json.loads(line) for line in (ROOT / "assets" / "prompts" / "heldout.jsonl").read_text().splitlines()]
    out = []
    for row in [rows[0], rows[3], rows[10]]:
        ids = embedded.encode_chat(row["messages"])
        out.append((ids, tokens(embedded_engine.generate(ids, GenParams(max_new_tokens=24)))))
    return out


@pytest.mark.parametrize("types", [["draft-head"], NGRAM_CHAIN + ["draft-head"]])
def test_shipped_head_is_lossless_on_the_embedded_model(embedded_engine, embedded_plain, types):
    n_acc = 0
    for ids, plain in embedded_plain:
        events = list(embedded_engine.generate(ids, GenParams(max_new_tokens=24, spec=SpecParams(
            types=types, n_max=4, adaptive=False, p_min=0.0))))
        assert tokens(events) == plain
        n_acc += sum(e.n_accepted for e in events if e.drafter == "draft-head")
    assert n_acc > 0


def test_eval_acceptance_sweep_counts_only_drafted_rounds_and_checks_losslessness(embedded, tmp_path, capsys,
                                                                                   monkeypatch):
    import engine.load.models
    from training import eval as head_eval

    monkeypatch.setattr(engine.load.models, "load_model", lambda name, **kw: embedded)  # the session's, loaded once
    prompts = tmp_path / "one.jsonl"
    prompts.write_text((ROOT / "assets" / "prompts" / "heldout.jsonl").read_text().splitlines()[3] + "\n")
    rc = head_eval.main(["--no-speed", "--max-new-tokens", "16", "--p-min", "0.6", "--threads", "2",
                         "--prompts", str(prompts)])
    out = capsys.readouterr().out
    assert rc == 0 and "lossless: yes" in out
    table = out.split("tokens per forward")[1].splitlines()[1:3]
    rows = {float(line.split()[0]): [float(x) for x in line.split()[1:]] for line in table}
    (share0, _, len0, tpf0), (share6, pos1_6, len6, tpf6) = rows[0.0], rows[0.6]
    assert share0 > 0.9 and share6 <= share0  # p_min 0 drafts (almost) every round, p_min 0.6 skips unsure ones
    assert 0.0 <= pos1_6 <= 1.0 and 1.0 <= len6 <= 5.0 and 1.0 <= len0 <= 5.0 and tpf6 >= 1.0 and tpf0 >= 1.0
    assert "ngram" not in out.split("measured speedup")[1]  # --no-speed: no speed configurations ran


def _bf16_native() -> bool:
    is_supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(is_supported is not None and is_supported())


@pytest.mark.skipif(not _bf16_native(), reason="no native bfloat16 on this CPU (oneDNN)")
def test_shipped_head_is_lossless_on_a_bfloat16_embedded_target():
    """The embedded model loaded in bfloat16: the head (trained on float32 features) is recognised, borrows the
    bfloat16 embedding table as it is (float32 only for its LM head's draft rows), and greedy speculative decoding
    gives plain decoding's tokens. Each run gets a fresh engine, so both prefill the whole prompt: in bfloat16 the
    prompt's last row forwarded in the prefill batch and forwarded alone after a reused prefix can pick different
    first tokens, which is not the drafter's doing."""
    from engine.load.models import load_model

    target = load_model("embedded", dtype="bfloat16")
    row = json.loads((ROOT / "assets" / "prompts" / "heldout.jsonl").read_text().splitlines()[0])
    ids = target.encode_chat(row["messages"])
    plain = tokens(Engine(target, n_ctx=1024, n_seq_max=1, calibrate=False).generate(
        ids, GenParams(max_new_tokens=24)))
    engine = Engine(target, n_ctx=1024, n_seq_max=1, calibrate=False)
    events = list(engine.generate(ids, GenParams(max_new_tokens=24, spec=SpecParams(
        types=["draft-head"], n_max=4, adaptive=False, p_min=0.0))))
    assert tokens(events) == plain
    assert sum(e.n_accepted for e in events if e.drafter == "draft-head") > 0
    head = engine.pool["draft-head"].head
    emb = target.model.get_input_embeddings().weight
    assert head.embed.dtype == torch.bfloat16 and head.embed.data_ptr() == emb.data_ptr()  # no float32 copy
    # its linears run in the target's dtype, the LM head's draft-vocabulary rows packed once (no float32 copy)
    assert head.lin_dtype == torch.bfloat16 and head.lm_weight is None
    with torch.inference_mode():
        assert head.logits(torch.zeros(2, head.cfg.hidden)).shape == (2, head.cfg.draft_vocab)


def test_features_of_forwards_not_yet_sorted_are_written_as_immediate_writes_would_leave_them(tiny_target,
                                                                                                 head_file):
    """The head sorts the forwards' features into its sequences' stores only when it drafts (or every
    sort_every forwards): the stores must then be what writing every forward at once would have left, a later
    forward's row winning where a position was forwarded twice (a rejected draft, then the target's token)."""
    from engine.memory.context import DecodeResult

    from engine.batch import Batch
    from engine.draft.head.drafter import DraftHeadDrafter

    drafter = DraftHeadDrafter(tiny_target, DraftHeadParams(weights=head_file))
    drafter.sort_every = 100
    n_feat = drafter.head.cfg.hidden * len(drafter.head.cfg.layers)
    g = torch.Generator().manual_seed(0)
    # (seq, pos, token) rows per forward: two sequences, positions 4 and 2 of seq 0 and 1 of seq 1 rewritten
    forwards = [[(0, 0, 5), (0, 1, 6), (0, 2, 7), (1, 0, 30), (1, 1, 31)], [(0, 3, 8), (0, 4, 9), (1, 2, 32)],
                [(1, 1, 33), (0, 4, 10), (0, 5, 11)], [(0, 2, 12)]]
    want = {seq: (torch.zeros(6, n_feat), torch.full((6,), -1)) for seq in (0, 1)}
    for rows in forwards:
        batch = Batch()
        for seq, pos, tok in rows:
            batch.add(tok, pos, seq, True)
        hidden = torch.randn(len(rows), n_feat, generator=g)
        drafter.process(batch, DecodeResult(None, 0.0, hidden=hidden))
        for i, (seq, pos, tok) in enumerate(rows):
            want[seq][0][pos], want[seq][1][pos] = hidden[i], tok
    assert len(drafter.unsorted) == len(forwards) and not drafter.states  # nothing written before it drafts
    drafter._sort()
    assert not drafter.unsorted
    for seq, (feats, toks) in want.items():
        n = 6 if seq == 0 else 3
        assert torch.equal(drafter.states[seq].feats[:n], feats[:n])
        assert drafter.states[seq].feat_tok[:n].tolist() == toks[:n].tolist()
    assert drafter.states[0].feat_tok[:6].tolist() == [5, 6, 12, 8, 10, 11]
    # a slot that never drafts still has its features written every sort_every forwards: they do not pile up
    drafter.sort_every = 2
    for pos, tok in ((6, 13), (7, 14)):
        batch = Batch()
        batch.add(tok, pos, 0, True)
        drafter.process(batch, DecodeResult(None, 0.0, hidden=torch.zeros(1, n_feat)))
    assert not drafter.unsorted and drafter.states[0].feat_tok[7] == 14
    batch = Batch()  # one forward alone, the round-by-round case of a slot that drafts every round
    for pos, tok in ((3, 15), (4, 16)):
        batch.add(tok, pos, 1, True)
    drafter.process(batch, DecodeResult(None, 0.0, hidden=torch.ones(2, n_feat)))
    drafter._sort()
    assert drafter.states[1].feat_tok[:5].tolist() == [30, 33, 32, 15, 16]
    assert torch.equal(drafter.states[1].feats[4], torch.ones(n_feat))
    # one forward of two slots, each slot's rows a run of positions (written as slices), then one whose rows of
    # slot 0 are split by slot 1's (written through the general case): the same stores either way
    for rows in ([(0, 8, 17), (0, 9, 18), (1, 5, 34), (1, 6, 35)], [(0, 10, 19), (1, 7, 36), (0, 11, 20)]):
        batch = Batch()
        for seq, pos, tok in rows:
            batch.add(tok, pos, seq, True)
        hidden = torch.randn(len(rows), n_feat, generator=g)
        drafter.process(batch, DecodeResult(None, 0.0, hidden=hidden))
        drafter._sort()
        for i, (seq, pos, tok) in enumerate(rows):
            assert int(drafter.states[seq].feat_tok[pos]) == tok
            assert torch.equal(drafter.states[seq].feats[pos], hidden[i])
    assert drafter.states[0].feat_tok[8:12].tolist() == [17, 18, 19, 20]


def test_the_inference_heads_fused_linears_and_rope_table_compute_what_the_trained_layers_do():
    from torch import nn

    from engine.forward import prepack
    from engine.draft.head.drafter import DEFAULT_WEIGHTS
    from engine.draft.head.net import _stacked

    trained = load_head(DEFAULT_WEIGHTS)
    served = load_head(DEFAULT_WEIGHTS)
    served.embed = trained.embed = torch.randn(trained.cfg.target_vocab, trained.cfg.hidden)
    served.lm_weight = trained.lm_weight = trained.embed[trained.d2t].contiguous()
    separate = [trained.q_proj, trained.k_proj, trained.v_proj]
    stacked = _stacked(separate)  # before for_inference packs and drops the trained modules
    served.for_inference(torch.float32)
    assert not hasattr(served, "q_proj") and set(served.fused) == {"qkv", "kv", "gate_up"}
    torch.manual_seed(0)
    feat, toks = torch.randn(5, trained.cfg.hidden), torch.randint(0, 1000, (5,))
    pos = torch.tensor([0, 3, 4, 300, 700])
    with torch.inference_mode():
        for a, b in zip(trained.qkv(feat, toks, pos), served.qkv(feat, toks, pos)):
            assert torch.allclose(a, b, rtol=2e-2, atol=2e-2)  # the served weights are float16 where the CPU allows
        attn = torch.randn(5, trained.cfg.n_heads * trained.cfg.head_dim)
        assert torch.allclose(trained.finish(feat, attn), served.finish(feat, attn), rtol=2e-2, atol=5e-2)
        # the catch-up's k and v for every row, q for the rows drafting starts from: what qkv gives them
        feat, toks, pos = torch.randn(20, trained.cfg.hidden), torch.randint(0, 1000, (20,)), torch.arange(20) * 7
        rows = torch.tensor([3, 19])  # 18 rows without a query: the split path
        q_all, k_all, v_all = served.qkv(feat, toks, pos)
        q, k, v = served.kv_then_q(feat, toks, pos, rows)
        assert q.shape == q_all[rows].shape and k.shape == k_all.shape and v.shape == v_all.shape
        exact = "our" in prepack.linear_paths(served.fused["kv"])
        for a, b in ((q, q_all[rows]), (k, k_all), (v, v_all)):
            assert torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5, atol=1e-5)
        # the one fused layer gives each output the bits its own layer gives, through the same packed kernel
        parts = []
        for layer in separate:
            part = nn.Linear(layer.in_features, layer.out_features, bias=False)
            part.weight = nn.Parameter(layer.weight.detach().clone(), requires_grad=False)
            parts.append(part)
        for module in parts + [stacked]:
            prepack.prepack_linears(module, store=torch.float16)
        x = torch.randn(3, stacked.in_features)
        out, alone = stacked(x), torch.cat([part(x) for part in parts], dim=-1)
        if "our" in prepack.linear_paths(stacked):
            assert torch.equal(out, alone)
        else:
            assert torch.allclose(out, alone, rtol=1e-5, atol=1e-5)


def test_the_heads_pieces_in_c_compute_what_its_torch_pieces_do():
    """engine/draft/head/step.py: fuse, q-k-v with rope, the attention output with the MLP and the logits in
    one C call each, where the served head's linears are our float16-weight kernel; the torch pieces over the
    same packed linears give the same values within rounding (only the norms sum in another order)."""
    from engine.forward import prepack
    from engine.draft.head.drafter import DEFAULT_WEIGHTS

    served = load_head(DEFAULT_WEIGHTS)
    served.embed = torch.randn(served.cfg.target_vocab, served.cfg.hidden)
    served.lm_weight = served.embed[served.d2t].contiguous()
    served.for_inference(torch.float32)
    if "our float16 kernel" not in prepack.linear_paths(served.fused["qkv"]):
        assert served.step is None  # oneDNN's linears: the torch pieces
        pytest.skip("our float16-weight kernel does not run here")
    step = served.step
    assert step is not None
    torch.manual_seed(0)
    c = served.cfg
    feats = torch.randn(6, c.hidden * len(c.layers)) * 4
    toks, pos = torch.randint(0, 1000, (6,)), torch.tensor([0, 1, 5, 40, 300, 700])
    attn = torch.randn(6, c.n_heads * c.head_dim)
    out = {}
    with torch.inference_mode():
        for name, s in (("c", step), ("torch", None)):
            served.step = s
            feat = served.fuse(feats)
            g = served.finish(feat, attn)
            out[name] = (feat, *served.qkv(feat, toks, pos), g, served.logits(g))
    for a, b in zip(out["c"], out["torch"]):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
