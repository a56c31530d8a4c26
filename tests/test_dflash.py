"""draft-dflash and draft-dspark: block drafts written in the authors' directory layout and in llama.cpp's GGUF
load to the same weights and the same drafts, every block equals the published equations computed from scratch,
speculation with them is token-identical to plain decoding (chains, trees, two slots in one forward), and a
checkpoint that is missing or does not fit is refused with the reason."""

import json

import pytest
import torch

from engine.draft.dflash import DFlashParams
from engine.load.dflash import dflash_kind, read_dflash
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from fresh import forgetting
from tiny_dflash import (BLOCK, MASK, as_stored_in_gguf, block_hidden, block_logits, draft_weights, features, fit,
                         markov_bias, save_tiny_target, write_gguf, write_hf)

PROMPTS = [[1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 10, 11, 12, 13, 14, 15, 16, 17], [1, 40, 41, 40, 41, 42],
           [1, 20, 21, 22, 20, 21, 22, 20], [1, 30, 31], [1, 7, 7, 7, 7, 8], [1, 50, 51, 52, 53, 54, 55],
           [1, 33, 44, 33, 44, 33]]
N_NEW = 16
KINDS = {"draft-dflash": False, "draft-dspark": True}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """drafter -> (reference weights, {layout: path}); the target's directory and model under "target", "model".
    Fitting on one thread is several times faster here than on threads that share two cores."""
    root = tmp_path_factory.mktemp("dflash")
    target_dir, target = save_tiny_target(root / "target")
    out = {"target": target_dir, "model": target}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, dspark in KINDS.items():
            w = draft_weights(1 + dspark, dspark)
            fit(w, target, PROMPTS[:3], steps=40, dspark=dspark)
            w = as_stored_in_gguf(w)  # both layouts hold the float16 values the GGUF stores
            out[name] = (w, {"hf": write_hf(root / f"{name}-hf", w, dspark),
                             "gguf": write_gguf(root / f"{name}.gguf", w, dspark)})
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def engines(ckpts):
    from engine.load.models import load_model

    # float32 whatever the suite's dtype: the drafts are compared with a float32 forward of the equations
    target = load_model(str(ckpts["target"]), device="cpu", dtype="float32")
    # one thread: the forwards are tiny, and threads that share two busy cores stall each other
    return {(name, layout): Engine(target, n_ctx=256, n_seq_max=2, calibrate=False, threads=1,
                                   drafter_params={name: DFlashParams(weights=ckpts[name][1][layout])})
            for name in KINDS for layout in ("hf", "gguf")}


fresh_engines = forgetting("engines")


@pytest.fixture(scope="module")
def plain(engines):
    engine = engines["draft-dflash", "hf"]
    return [tokens(engine.generate(p, GenParams(max_new_tokens=N_NEW, ignore_eos=True))) for p in PROMPTS]


def tokens(events) -> list[int]:
    return [t for e in events for t in e.emitted]


def spec_params(name, temp=0.0, seed=0, tree=0, n_max=8):
    return GenParams(max_new_tokens=N_NEW, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                     spec=SpecParams(types=[name], n_max=n_max, adaptive=False, p_min=0.0, tree_nodes=tree))


def reference_draft(w: dict, target, confirmed: list[int], dspark: bool) -> list[int]:
    """The block after `confirmed` (its last token id_last), from scratch: the target's features of the context,
    the block [id_last, mask...] through the draft, greedy; DSpark row by row under the Markov bias of the token
    before, from the anchor row on."""
    feats = features(target, confirmed[:-1])
    block = torch.tensor([[confirmed[-1]] + [MASK] * (BLOCK - 1)])
    with torch.no_grad():
        logits = block_logits(w, target, block_hidden(w, target, feats, block, torch.tensor([len(confirmed) - 1])))
    if not dspark:
        return logits[1:].argmax(-1).tolist()
    out, prev = [], confirmed[-1]
    for row in range(BLOCK):
        prev = int((logits[row] + markov_bias(w, prev)).argmax())
        out.append(prev)
    return out


def spy_drafts(engine, name, prompts, n_max=8):
    d = engine.drafter(name)
    seen, real = [], d.draft

    def spy(requests):
        real(requests)
        seen.extend((r.prompt + [r.id_last], list(r.result), r.n_max) for r in requests)

    d.draft = spy
    try:
        for prompt in prompts:
            list(engine.generate(prompt, spec_params(name, n_max=n_max)))
    finally:
        del d.draft
    return seen


def test_both_layouts_read_to_the_same_checkpoint(ckpts):
    for name, dspark in KINDS.items():
        w, paths = ckpts[name]
        hf, gguf = read_dflash(paths["hf"]), read_dflash(paths["gguf"])
        assert (hf.layout, gguf.layout) == ("hf", "gguf") and hf.kind == gguf.kind == name[len("draft-"):]
        assert hf.hidden_layers == gguf.hidden_layers == (2, 4)  # layer ids 1, 3 read as hidden_states[id + 1]
        assert hf.block_size == gguf.block_size == BLOCK and hf.mask_token_id == gguf.mask_token_id == MASK
        assert sorted(hf.tensors) == sorted(gguf.tensors) and hf.has_confidence == gguf.has_confidence == dspark
        assert all(torch.equal(hf.tensors[k], gguf.tensors[k]) for k in hf.tensors)
        assert torch.equal(hf.tensors["fc"], w["fc.weight"])
        if dspark:
            assert torch.equal(hf.d2t, gguf.d2t) and torch.equal(hf.d2t, w["d2t"] + torch.arange(len(w["d2t"])))
        assert dflash_kind(paths["hf"]) == dflash_kind(paths["gguf"]) == name


def test_a_gguf_of_q8_0_blocks_reads_to_the_weights_within_their_rounding(ckpts, tmp_path):
    w = ckpts["draft-dspark"][0]
    exact = read_dflash(ckpts["draft-dspark"][1]["gguf"])
    q8 = read_dflash(write_gguf(tmp_path / "q8.gguf", w, True, q8=True))
    assert sorted(exact.tensors) == sorted(q8.tensors)
    blocks = 0
    for k, t in exact.tensors.items():
        # Q8_0: 32 values share a float16 scale of their max / 127, so each is within about half a step of it
        step = t.abs().max() / 127 if t.ndim == 2 and t.shape[-1] % 32 == 0 else 0.0
        assert q8.tensors[k].shape == t.shape and (q8.tensors[k] - t).abs().max() <= step * 0.6 + 1e-6, k
        blocks += bool(step) and not torch.equal(q8.tensors[k], t)
    assert blocks > 10  # the matrices were stored as blocks, not as they were


@pytest.mark.parametrize("name", list(KINDS))
def test_every_block_is_the_published_forward_and_layouts_draft_alike(ckpts, engines, name):
    w, dspark = ckpts[name][0], KINDS[name]
    seen = spy_drafts(engines[name, "hf"], name, PROMPTS[:2], n_max=8)
    assert len(seen) > 5
    target = ckpts["model"]
    for confirmed, drafted, n_max in seen:
        want = reference_draft(w, target, confirmed, dspark)
        assert drafted == want[:n_max] and len(drafted) == min(n_max, BLOCK if dspark else BLOCK - 1)
    assert spy_drafts(engines[name, "gguf"], name, PROMPTS[:2], n_max=8) == seen


@pytest.mark.parametrize("tree", [0, 8])
@pytest.mark.parametrize("name", list(KINDS))
def test_speculation_is_token_identical_to_plain(engines, plain, name, tree):
    engine = engines[name, "gguf" if tree else "hf"]
    accepted = 0
    for prompt, want in zip(PROMPTS, plain):
        events = list(engine.generate(prompt, spec_params(name, tree=tree)))
        assert tokens(events) == want
        accepted += sum(e.n_accepted for e in events if e.kind == "spec")
        assert all(e.verify_mode == ("tree" if tree else "match") for e in events if e.kind == "spec")
    assert accepted >= 2 * len(PROMPTS), "the fitted drafts were hardly ever kept"


@pytest.mark.parametrize("name", list(KINDS))
def test_two_slots_in_one_forward_equal_running_alone(engines, plain, name):
    engine = engines[name, "hf"]
    got = {0: [], 1: []}
    engine.start(PROMPTS[0], spec_params(name), seq=0)
    engine.start(PROMPTS[1], spec_params(name), seq=1)
    shared = False
    while engine.active():
        events = engine.step()
        shared = shared or any(e.kind == "spec" and e.batch_rows > BLOCK for e in events)
        for e in events:
            got[e.seq].extend(e.emitted)
    for seq in (0, 1):
        engine.release(seq)
    assert [got[0], got[1]] == plain[:2] and shared


def test_sampling_uses_rejection_with_the_blocks_q_and_is_reproducible(engines):
    engine = engines["draft-dspark", "hf"]
    a, b = (list(engine.generate(PROMPTS[0], spec_params("draft-dspark", temp=0.8, seed=3))) for _ in range(2))
    assert tokens(a) == tokens(b)
    spec = [e for e in a if e.kind == "spec"]
    assert spec and all(e.verify_mode == "rejection" for e in spec)


def test_a_missing_or_unfitting_checkpoint_is_refused_with_the_reason(ckpts, engines, tmp_path):
    from engine.bench.contest import why_not

    target = engines["draft-dflash", "hf"].target
    assert why_not("draft-dflash", target, None) == \
        "needs a DFlash or DSpark checkpoint (--draft DIR or FILE.gguf); none is loaded"
    dspark_dir = str(ckpts["draft-dspark"][1]["hf"])
    assert why_not("draft-dflash", target, None, dflash=dspark_dir) == "the checkpoint given drafts as draft-dspark"
    assert why_not("draft-dspark", target, None, dflash=dspark_dir) is None
    wrong = Engine(target, n_ctx=64, n_seq_max=1, calibrate=False,
                   drafter_params={"draft-dflash": DFlashParams(weights=ckpts["draft-dspark"][1]["gguf"])})
    with pytest.raises(ValueError, match="drafts as draft-dspark"):
        wrong.drafter("draft-dflash")
    with pytest.raises(ValueError, match="needs a DFlash or DSpark checkpoint"):
        Engine(target, n_ctx=64, n_seq_max=1, calibrate=False).drafter("draft-dflash")
    cfg_path = ckpts["draft-dflash"][1]["hf"] / "config.json"
    swa = tmp_path / "swa"
    swa.mkdir()
    (swa / "model.safetensors").write_bytes((cfg_path.parent / "model.safetensors").read_bytes())
    (swa / "config.json").write_text(json.dumps({**json.loads(cfg_path.read_text()), "use_sliding_window": True}))
    with pytest.raises(ValueError, match="use_sliding_window"):
        read_dflash(swa)
    with pytest.raises(ValueError, match="not a DFlash or DSpark checkpoint"):
        read_dflash(ckpts["target"])


def test_the_bench_lists_them_and_the_arena_ranks_them(engines, ckpts, capsys):
    from engine.bench.cli import parse_args
    from engine.bench.contest import ArenaParams, engine_runner, run_arena
    from engine.bench.leaderboard import leaderboard

    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    assert "draft-dflash" in out and "draft-dspark" in out
    engine = engines["draft-dspark", "gguf"]
    result = run_arena(engine_runner(engine), PROMPTS[:1], engine.target, None,
                       ArenaParams(n_max=4, max_new_tokens=8, ignore_eos=True, chain=["ngram-simple"],
                                   dflash=str(ckpts["draft-dspark"][1]["gguf"])))
    rows = {r["drafter"]: r for r in leaderboard(result)}
    assert "draft-dspark" in rows and "draft-dflash" not in rows
    assert all(r["lossless"] == "True" for r in rows.values())
    assert any(s.startswith("draft-dflash: the checkpoint given drafts as draft-dspark") for s in result.skipped)


def test_the_bench_runs_a_block_drafter_given_as_draft(ckpts, tmp_path, capsys):
    """`--draft PATH` names the checkpoint; its kind takes draft-simple's place in --spec, as an EAGLE-3 head's."""
    from engine.bench.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "w1 w2 w3 w1 w2 w3 w1"}) + "\n")
    out = tmp_path / "traces.csv"
    rc = main(["--prompts", str(prompts), "--target", str(ckpts["target"]), "--draft",
               str(ckpts["draft-dflash"][1]["gguf"]), "--spec", "draft-simple", "--max-new-tokens", "8",
               "--n-ctx", "128", "--threads", "1", "--device", "cpu", "--out", str(out), "--ignore-eos"])
    text = capsys.readouterr().out
    assert rc == 0 and "draft-dflash" in text
    import csv

    rows = list(csv.DictReader(out.open()))
    spec = [r for r in rows if r["spec_decode"] == "on"]
    assert spec and spec[0]["spec_types"] == "draft-dflash" and spec[0]["lossless_ok"] == "True"


def test_the_context_entries_are_those_of_the_confirmed_tokens_only(ckpts, engines):
    """After a run the cache holds one entry per confirmed position before the last id_last, each layer's key
    and value those the published equations give for the target's features there: rejected rows left nothing."""
    from tiny_dflash import rms, rope

    name = "draft-dflash"
    engine, w = engines[name, "hf"], ckpts[name][0]
    d = engine.drafter(name)
    engine.start(PROMPTS[1], spec_params(name), seq=0)
    emitted = []
    while engine.active():
        emitted.extend(t for e in engine.step() for t in e.emitted)
    confirmed = list(d.states[0].tokens)
    cells = d.cache.seq_cells(0)
    keys = [d.cache.k[i][0][:, cells].clone() for i in range(2)]
    values = [d.cache.v[i][0][:, cells].clone() for i in range(2)]
    positions = d.cache.cell_pos[cells].tolist()
    engine.release(0)
    assert confirmed == (PROMPTS[1] + emitted)[:len(confirmed)] and len(confirmed) > len(PROMPTS[1])
    assert positions == list(range(len(confirmed))) and not len(d.cache.seq_cells(0))  # released: none left
    g = rms(features(ckpts["model"], confirmed) @ w["fc.weight"].T, w["hidden_norm.weight"])
    for i in range(2):
        k = rms((g @ w[f"layers.{i}.self_attn.k_proj.weight"].T).view(len(confirmed), 2, 16),
                w[f"layers.{i}.self_attn.k_norm.weight"])
        k = rope(k.transpose(0, 1), torch.arange(len(confirmed)))
        v = (g @ w[f"layers.{i}.self_attn.v_proj.weight"].T).view(len(confirmed), 2, 16).transpose(0, 1)
        assert torch.allclose(keys[i], k, atol=1e-4) and torch.allclose(values[i], v, atol=1e-4)


def test_dspark_stops_where_its_confidence_head_falls_below_p_min(ckpts, engines):
    from engine.draft.base import DraftRequest

    name = "draft-dspark"
    engine, w = engines[name, "hf"], ckpts[name][0]
    d = engine.drafter(name)
    confirmed = PROMPTS[2]
    engine.start(confirmed, GenParams(max_new_tokens=2), seq=0)
    engine.step()  # the prompt's forward: the drafter keeps its features
    full = DraftRequest(seq=0, prompt=confirmed[:-1], id_last=confirmed[-1], n_max=8, n_min=0, p_min=0.0)
    d.draft([full])
    block = torch.tensor([[confirmed[-1]] + [MASK] * (BLOCK - 1)])
    feats = features(ckpts["model"], confirmed[:-1])
    with torch.no_grad():
        h = block_hidden(w, ckpts["model"], feats, block, torch.tensor([len(confirmed) - 1]))
    prev, conf = [confirmed[-1]] + full.result[:-1], []
    for row, p in enumerate(prev):
        feat = torch.cat([h[row], w["markov_head.markov_w1.weight"][p]])
        conf.append(float(torch.sigmoid(w["confidence_head.proj.weight"][0] @ feat + w["confidence_head.proj.bias"])))
    assert len(full.result) == BLOCK
    for cut in range(1, BLOCK):
        p_min = sorted(conf)[cut - 1] + 1e-6  # the cut-th lowest confidence falls below it
        r = DraftRequest(seq=0, prompt=confirmed[:-1], id_last=confirmed[-1], n_max=8, n_min=0, p_min=p_min)
        d.draft([r])
        want = next((j for j, c in enumerate(conf) if c < p_min), BLOCK)
        assert r.result == full.result[:want]
    engine.release(0)


def test_a_prompt_sharing_a_cached_prefix_drafts_from_its_features(engines):
    """The second prompt's prefix is the first's cached cells (seq_cp): its features come from the first, and
    its answer is still plain decoding's."""
    name = "draft-dflash"
    engine = engines[name, "hf"]
    d = engine.drafter(name)
    first = tokens(engine.generate(PROMPTS[0], spec_params(name), seq=0))
    second = PROMPTS[0] + first[:6]
    want = tokens(engine.generate(second, GenParams(max_new_tokens=N_NEW, ignore_eos=True), seq=0))
    engine.release(0)
    list(engine.generate(PROMPTS[0], spec_params(name), seq=0))
    copied, real = [], d.seq_cp
    d.seq_cp = lambda src, dst, n: (copied.append((src, dst, n)), real(src, dst, n))
    try:
        events = list(engine.generate(second, spec_params(name), seq=1))
        n_shared = copied[0][2] if copied else 0
        known = d.states[1].feat_tok[:n_shared].tolist()
        same = torch.equal(d.states[1].feats[:n_shared], d.states[0].feats[:n_shared])
    finally:
        del d.seq_cp
        engine.release(0)
        engine.release(1)
    assert tokens(events) == want and copied and copied[0][:2] == (0, 1) and n_shared > 4
    assert known == second[:n_shared] and same


def test_the_app_offers_a_checkpoint_given_as_draft_as_its_block_drafter(ckpts, engines):
    import app
    from ui.loader import make_runtime
    from ui.settings import full_chain
    from ui.state import AppOptions

    path = str(ckpts["draft-dspark"][1]["gguf"])
    assert app.parse_args(["--draft", path]).draft == path
    runtime = make_runtime(engines["draft-dspark", "hf"].target, None,
                           AppOptions(n_ctx=256, parallel=1, dflash=path, threads=1))
    assert runtime.draft is None and full_chain(runtime)[-1] == "draft-dspark"
    assert runtime.engine.drafter("draft-dspark").hidden_layers == (2, 4)
