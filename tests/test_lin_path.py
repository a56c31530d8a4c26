"""A CPU drafter's linears in the target's arithmetic (engine/draft/lin_path.py): each path multiplies within its
rounding of float32, "auto" keeps a path only by timing and falls back to torch's, a bad name is refused naming
the field; draft-mtp, draft-dflash and draft-eagle3 in each path draft within rounding of float32, and speculation with them
stays token-identical to plain decoding."""

import pytest
import torch
from torch import nn

from engine.draft.dflash import DFlashParams
from engine.draft.lin_path import LinPath, apply, choose, offered, resolve, runs_here
from engine.draft.mtp import MtpParams
from engine.forward.quant_dot import dot_reason
from engine.params import GenParams, SpecParams
from engine.serve.engine import Engine
from engine.draft.base import DraftRequest
from engine.draft.head.eagle3 import Eagle3Params
from test_eagle3 import N_LAYERS, reference_weights, write_eagle
from tiny import save_tiny
from tiny_dflash import draft_weights, save_tiny_target, write_hf
from tiny_mtp import save_tiny_mtp

PROMPTS = [[1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 10, 11, 12, 13, 14, 15, 16, 17]]
N_NEW = 16
# relative error of a linear's outputs each path allows against float32's: bfloat16 keeps 8 bits of mantissa;
# Q8_0 rounds weights and inputs to 8 bits per group of 32
TOLERANCE = {"torch": 1e-6, "float32": 1e-5, "bfloat16": 2e-2, "int8": 3e-2}
PATHS = [p for p in ("float32", "bfloat16", "int8") if runs_here(p)]


def _linears(gen: torch.Generator) -> list[nn.Linear]:
    out = []
    for n_out, n_in in ((64, 128), (96, 64), (64, 96)):
        m = nn.Linear(n_in, n_out, bias=False)
        with torch.no_grad():
            m.weight.copy_(torch.randn(n_out, n_in, generator=gen) / n_in ** 0.5)
        out.append(m)
    return out


@pytest.mark.parametrize("path", ["torch"] + PATHS)
def test_each_path_multiplies_within_its_rounding_of_float32(path):
    gen = torch.Generator().manual_seed(0)
    linears = _linears(gen)
    xs = [torch.randn(rows, m.in_features, generator=gen) for m in linears for rows in (1, 5)]
    with torch.no_grad():
        want = [m(x) for m in linears for x in xs if x.shape[1] == m.in_features]
        assert apply(linears, path) == len(linears)
        got = [m(x) for m in linears for x in xs if x.shape[1] == m.in_features]
    for w, g in zip(want, got):
        assert g.dtype == torch.float32 and g.shape == w.shape
        assert float((g - w).norm() / w.norm()) < TOLERANCE[path]


def test_auto_weighs_the_paths_offered_and_keeps_torch_unless_another_is_faster():
    linears = _linears(torch.Generator().manual_seed(1))
    choice = choose("auto", linears, "float32", (1, 4), "draft-x")
    assert choice.path in offered("float32")
    assert set(choice.ms) == set(offered("float32"))
    if choice.path != "torch":
        assert choice.ms[choice.path] < 0.95 * choice.ms["torch"]
    assert "int8" not in offered("float32") and "bfloat16" not in offered("float32")
    assert choose("int8", linears, "float32", (1,), "draft-x") == LinPath("int8", "int8 as asked")
    with pytest.raises(ValueError, match="draft-x: dtype must be one of"):
        choose("float16", linears, "float32", (1,), "draft-x")


@pytest.mark.parametrize("timed, chosen", [({"torch": 1.0, "float32": 0.5, "int8": 0.3}, "int8"),
                                           ({"torch": 1.0, "float32": 0.5, "int8": 0.6}, "float32"),
                                           ({"torch": 1.0, "float32": 0.97, "int8": 0.96}, "torch")])
def test_auto_takes_the_fastest_path_only_under_the_margin(monkeypatch, timed, chosen):
    from engine.draft import lin_path

    monkeypatch.setattr(lin_path, "offered", lambda target: list(timed))
    monkeypatch.setattr(lin_path, "time_paths", lambda linears, paths, rows: dict(timed))
    choice = choose("auto", _linears(torch.Generator().manual_seed(3)), "int8", (1, 4), "draft-x")
    assert choice.path == chosen and choice.ms == timed and choice.reason.startswith(f"auto: {chosen}")


def test_a_path_a_shape_does_not_fit_keeps_that_linear_as_loaded():
    odd = nn.Linear(33, 7, bias=False)  # Q8_0 groups need inputs in 32s
    x = torch.randn(2, 33)
    with torch.no_grad():
        want = odd(x)
        choice = resolve("int8", [odd], "int8", (1,), "draft-x")
        got = odd(x)
    if not dot_reason():
        assert "1 of 1 linears kept as loaded" in choice.reason
    assert torch.equal(got, want)


def load_float32(path):
    from engine.load.models import load_model

    # float32 whatever the suite's dtype: each path is compared with torch's float32 drafts
    return load_model(str(path), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("lin_path")
    mtp_dir, _ = save_tiny_mtp(root / "mtp", seed=0, n_mtp=2)
    target_dir, _ = save_tiny_target(root / "target")
    return {"mtp": load_float32(mtp_dir), "dflash": load_float32(target_dir),
            "dflash_ck": write_hf(root / "dflash", draft_weights(1, False), False),
            "eagle3": load_float32(save_tiny(root / "deep", seed=0, layers=N_LAYERS)),
            "eagle3_ck": write_eagle(root / "eagle3", reference_weights("midlayer.", 2), "safetensors")}


def _engine(targets, name: str, path: str) -> Engine:
    if name == "draft-eagle3":
        return Engine(targets["eagle3"], n_ctx=256, n_seq_max=1, calibrate=False, threads=1,
                      drafter_params={name: Eagle3Params(weights=targets["eagle3_ck"], dtype=path)})
    if name == "draft-mtp":
        return Engine(targets["mtp"], n_ctx=256, n_seq_max=1, calibrate=False, threads=1,
                      drafter_params={name: MtpParams(dtype=path)})
    return Engine(targets["dflash"], n_ctx=256, n_seq_max=1, calibrate=False, threads=1,
                  drafter_params={name: DFlashParams(weights=targets["dflash_ck"], dtype=path)})


def _generate(engine, name=None) -> list[int]:
    spec = SpecParams(types=[name], n_max=4, adaptive=False, p_min=0.0) if name else None
    params = GenParams(max_new_tokens=N_NEW, ignore_eos=True, **({"spec": spec} if spec else {}))
    return [t for p in PROMPTS for e in engine.generate(p, params) for t in e.emitted]


def _draft_logits(engine, name: str) -> torch.Tensor:
    """The drafter's network on fixed inputs: the MTP layers' logits after a feature, the block's logits."""
    d = engine.drafter(name)
    if name == "draft-eagle3":
        return _head_chain_p(engine)
    gen = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        if name == "draft-mtp":
            feats = torch.randn(1, 6, d.hidden, generator=gen)
            g = d.net.forward_layer(0, feats, torch.arange(1, 7)[None], None, input_ids=torch.arange(5, 11)[None])
            return d._logits(g[0])
        net = d.net
        ctx = net.context_kv(net.fuse(torch.randn(6, net.lin["fc"].in_features, generator=gen)), torch.arange(6))
        ctx = [(k.transpose(0, 1), v.transpose(0, 1)) for k, v in ctx]
        block = torch.tensor([7] + [d.ck.mask_token_id] * (d.ck.block_size - 1))
        visible = torch.ones(len(block), 6 + len(block), dtype=torch.bool)
        return net.logits(net.block(block, torch.arange(6, 6 + len(block)), ctx, visible))


def _head_chain_p(engine) -> tuple[list[int], torch.Tensor]:
    """An EAGLE-3 head's first drafted token after each prompt, and their probabilities."""
    d, toks, out = engine.drafter("draft-eagle3"), [], []
    for prompt in PROMPTS:
        engine.start(prompt, GenParams(max_new_tokens=2), seq=0)
        engine.step()  # the prefill: the head has the target's features of every prompt position
        r = DraftRequest(seq=0, prompt=prompt[:-1], id_last=prompt[-1], n_max=1, n_min=0, p_min=0.0)
        d.draft([r])
        toks.append(r.result[0])
        out.append(r.result_p[0])
        engine.release(0)
    return toks, torch.tensor(out)


def _lin_path(engine, name: str):
    return engine.drafter(name).lin_path


NAMES = ["draft-mtp", "draft-dflash", "draft-eagle3"]


@pytest.mark.parametrize("name", NAMES)
def test_each_path_drafts_within_rounding_and_speculates_as_plain_decoding(targets, name):
    engines = {p: _engine(targets, name, p) for p in ["torch"] + PATHS}
    assert _lin_path(engines["torch"], name).path == "torch"
    plain = _generate(engines["torch"])
    for path in PATHS:
        base = _draft_logits(engines["torch"], name)
        choice = _lin_path(engines[path], name)
        assert choice.path == path and "kept as loaded" not in choice.reason
        logits = _draft_logits(engines[path], name)
        if name == "draft-eagle3":  # the same tokens, their probabilities within rounding
            assert logits[0] == base[0], path
            logits, base = logits[1], base[1]
        err = float((logits - base).norm() / base.norm())
        assert err < 10 * TOLERANCE[path], path
        assert _generate(engines[path], name) == plain, path


@pytest.mark.parametrize("name", NAMES)
def test_auto_chooses_at_load_and_speculates_as_plain_decoding(targets, name):
    engine = _engine(targets, name, "auto")
    choice = _lin_path(engine, name)
    assert choice.path in offered("float32") and choice.reason.startswith("auto: ")
    assert _generate(engine, name) == _generate(engine)


def test_the_arena_takes_the_heads_dtype_and_refuses_another(capsys):
    from engine.bench.arena import parse_args

    assert parse_args(["--prompts", "p.jsonl", "--head-dtype", "int8"]).head_dtype == "int8"
    assert parse_args(["--prompts", "p.jsonl"]).head_dtype == "auto"
    with pytest.raises(SystemExit):
        parse_args(["--prompts", "p.jsonl", "--head-dtype", "float16"])
    assert "--head-dtype" in capsys.readouterr().err
