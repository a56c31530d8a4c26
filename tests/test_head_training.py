"""The draft head's training command end to end on a tiny target: it makes its data, caches it per target and
data parameters, writes a head the drafter loads, and never trains on the evaluation prompts."""

import json

import pytest
import torch

from engine.draft.head.drafter import DraftHeadParams
from engine.draft.head.net import load_head, target_fingerprint
from engine.params import GenParams, SpecParams
from engine.serve.engine import Engine
from training import train
from training.data import DataParams, data_layers, data_path, load_or_build, local_texts, self_distill
from training.prompts import check_disjoint, load_jsonl_contents, training_prompts

QUICK = ["--parts", "1", "--n-topic", "6", "--n-copy", "2", "--max-new-tokens", "12", "--doc-tokens", "512",
         "--epochs", "2", "--draft-vocab", "40", "--layers", "0", "1", "2", "--batch-tokens", "256", "--threads", "1"]


@pytest.fixture(scope="module")
def trained(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("headtrain")
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECPLAY_CACHE", str(root / "cache"))
    out = root / "head.safetensors"
    assert train.main(["--target", str(tiny_dirs["target"]), "--out", str(out)] + QUICK) == 0
    yield root, out
    mp.undo()


def test_training_writes_a_head_that_drafts_losslessly(trained, tiny_target):
    _, out = trained
    head = load_head(out)
    cfg = json.loads(out.with_suffix(".json").read_text())
    assert cfg["layers"] == [0, 1, 2] and cfg["draft_vocab"] == 40
    assert cfg["target_fingerprint"] == target_fingerprint(tiny_target.model.get_input_embeddings().weight)
    assert cfg["extra"]["epochs_run"] == 2 and len(cfg["extra"]["val_acc_per_step"]) == 3
    assert sorted(set(head.d2t.tolist())) == head.d2t.tolist()  # distinct target ids
    assert tiny_target.eos_ids() <= set(head.d2t.tolist())  # end of turn can always be drafted
    engine = Engine(tiny_target, n_ctx=256, n_seq_max=1, calibrate=False,
                    drafter_params={"draft-head": DraftHeadParams(weights=out)})
    prompt = [1, 10, 11, 12, 13, 14, 15]
    plain = [t for e in engine.generate(prompt, GenParams(max_new_tokens=24, ignore_eos=True)) for t in e.emitted]
    spec = engine.generate(prompt, GenParams(max_new_tokens=24, ignore_eos=True, spec=SpecParams(
        types=["draft-head"], n_max=3, adaptive=False, p_min=0.0)))
    events = list(spec)
    assert [t for e in events for t in e.emitted] == plain
    assert any(e.drafter == "draft-head" and e.drafted for e in events)


def test_data_is_cached_per_target_and_remade_for_other_parameters(trained, tiny_target):
    root, _ = trained
    fp = target_fingerprint(tiny_target.model.get_input_embeddings().weight)
    path = data_path(root / "cache" / "draft-head" / fp, 0)
    assert path.is_file()
    params = DataParams(n_topic=6, n_copy=2, max_new_tokens=12, doc_tokens=512, part=0)
    cached = load_or_build(path, tiny_target, params, [])
    assert cached["params"] == params.__dict__
    r = cached["records"][0]
    n = len(r["tokens"])
    assert r["feats"].shape[0] == n and r["top_ids"].shape[0] == n and 0 <= r["first_label"] < n
    # the labels are the target's own next-token choice at the labelled positions
    with torch.inference_mode():
        logits = tiny_target.model(r["tokens"].long()[None]).logits[0]
    lab = slice(r["first_label"], n)
    assert torch.equal(logits[lab].argmax(-1), r["top_ids"][lab, 0].long())
    other = DataParams(n_topic=3, n_copy=1, max_new_tokens=6, doc_tokens=256, part=0)
    remade = load_or_build(path, tiny_target, other, [])
    assert remade["params"] == other.__dict__ and len(remade["prompts"]) < len(cached["prompts"])


def test_training_prompts_are_disjoint_across_parts_and_from_the_evaluation_prompts():
    root = train.ROOT
    texts = local_texts(limit_chars=200_000)
    parts = [training_prompts(texts, 200, 4, torch.Generator().manual_seed(1234), part=k) for k in range(3)]
    contents = [{p["content"] for p in part} for part in parts]
    assert all(len(c) == len(p) for c, p in zip(contents, parts))
    assert not (contents[0] & contents[1]) and not (contents[1] & contents[2]) and not (contents[0] & contents[2])
    held = set()
    for name in ("heldout.jsonl", "unseen.jsonl", "fresh.jsonl"):
        held |= set(load_jsonl_contents(root / "assets" / "prompts" / name))
    assert len(held) == 34 and not any(held & c for c in contents)
    check_disjoint(parts[0], train.HELD_OUT)
    fresh = load_jsonl_contents(root / "assets" / "prompts" / "fresh.jsonl")
    for clash in (next(iter(held)), fresh[0]):  # every evaluation set is refused, the newest one too
        with pytest.raises(ValueError, match="overlap the evaluation prompts"):
            check_disjoint(parts[0] + [{"content": clash}], train.HELD_OUT)


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    """Reference decoding: a full forward per token, no cache, no batch."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_self_distillation_batch_equals_plain_greedy_decoding(tiny_target):
    """The batched loop (left padding, rows leaving at their end of turn) gives each prompt's own greedy answer,
    the hidden states of a plain forward over it, and the target's distribution as labels."""
    model = tiny_target.model
    prompts = [[1, 5, 6, 7], [1, 9, 10, 11, 12, 13, 14], [1, 20], [1, 30, 31, 32, 33]]
    n_new = 10
    free = [_greedy(model, p, n_new) for p in prompts]
    eos = {free[0][3]}  # an end of turn that stops some rows early and others not at all
    want = [a[:next((j + 1 for j, t in enumerate(a) if t in eos), n_new)] for a in free]
    assert len({len(a) for a in want}) > 1  # rows really leave the batch at different steps
    recs = self_distill(tiny_target, prompts, DataParams(max_new_tokens=n_new, gen_batch=4), eos)
    layers = data_layers(model.config.num_hidden_layers)
    assert len(recs) == len(prompts)
    for r in recs:
        k = r["first_label"] + 1
        i = next(i for i, p in enumerate(prompts) if p == r["tokens"][:k].tolist() and len(p) == k)
        answer = r["tokens"][k:].tolist() + [int(r["top_ids"][-1, 0])]
        assert answer == want[i]
        with torch.inference_mode():
            out = model(r["tokens"].long()[None], output_hidden_states=True)
        feats = torch.cat([out.hidden_states[j][0] for j in layers], dim=-1)
        assert torch.allclose(r["feats"].float(), feats, rtol=1e-2, atol=1e-2)
        probs = torch.softmax(out.logits[0, k - 1:].float(), dim=-1)
        assert torch.allclose(r["top_p"][k - 1:, 0].float(), probs.max(-1).values, atol=2e-3)
