"""draft-eagle3: EAGLE-3 heads written in the EAGLE authors' layout (eagle/model/cnets.py: fc, midlayer.*, norm,
lm_head, d2t offsets, t2d) and in speculators' (config with speculators_model_type eagle3, layers.0.*) load,
compute what the reference equations compute, draft chains and trees losslessly, and are refused on a target
they do not fit."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from engine.draft.base import DraftRequest
from engine.draft.head.eagle3 import Eagle3Params
from engine.draft.head.tree import HeadTreeParams
from engine.load.eagle3 import detect_layout, is_eagle3_dir
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from tiny import load_tiny, save_tiny

H, HEADS, KV, HD, INTER, VOCAB, DRAFT_VOCAB, EPS, THETA = 64, 4, 2, 16, 96, 64, 48, 1e-5, 10000.0
N_LAYERS = 8  # the target's depth: EAGLE-3's default layers 2, n//2, n-3 are then 2, 4, 5
PROMPTS = [[1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 10, 11, 12, 13, 14, 15, 16, 17], [1, 40, 41, 40, 41, 42]]
SPEC_LAYERS = [1, 4, 6]


def reference_weights(prefix: str, seed: int, hidden: int = H) -> dict:
    """Random weights under the reference names (prefix "midlayer." or "layers.0."), d2t as offsets."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale / math.sqrt(shape[-1])

    used = torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[used] = True
    out = {"fc.weight": w(hidden, 3 * hidden), "norm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
           "lm_head.weight": w(DRAFT_VOCAB, hidden, scale=6.0), "d2t": used - torch.arange(DRAFT_VOCAB), "t2d": t2d}
    layer = {"self_attn.q_proj.weight": w(HEADS * HD, 2 * hidden, scale=3.0),
             "self_attn.k_proj.weight": w(KV * HD, 2 * hidden, scale=3.0),
             "self_attn.v_proj.weight": w(KV * HD, 2 * hidden), "self_attn.o_proj.weight": w(hidden, HEADS * HD),
             "mlp.gate_proj.weight": w(INTER, hidden), "mlp.up_proj.weight": w(INTER, hidden),
             "mlp.down_proj.weight": w(hidden, INTER)}
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        layer[f"{name}.weight"] = 1 + 0.1 * torch.randn(hidden, generator=g)
    out.update({prefix + k: v for k, v in layer.items()})
    return out


def llama_fields(hidden: int = H) -> dict:
    return dict(hidden_size=hidden, num_attention_heads=HEADS, num_key_value_heads=KV, intermediate_size=INTER,
                vocab_size=VOCAB, rms_norm_eps=EPS, rope_theta=THETA, rope_scaling=None, num_hidden_layers=1,
                max_position_embeddings=2048, hidden_act="silu", model_type="llama")


def write_eagle(path, weights: dict, fmt: str, hidden: int = H):
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": DRAFT_VOCAB, **llama_fields(hidden)}
    (path / "config.json").write_text(json.dumps(cfg))
    if fmt == "bin":
        torch.save(weights, path / "pytorch_model.bin")
    else:
        save_file(weights, str(path / "model.safetensors"))
    return path


def write_speculators(path, weights: dict, norm_before_residual: bool):
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
           "transformer_layer_config": {**llama_fields(), "head_dim": HD}, "draft_vocab_size": DRAFT_VOCAB,
           "norm_before_residual": norm_before_residual, "eagle_aux_hidden_state_layer_ids": SPEC_LAYERS,
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                  "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}}}
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(weights, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def deep_target(tmp_path_factory):
    return load_tiny(save_tiny(tmp_path_factory.mktemp("deep") / "target", seed=0, layers=N_LAYERS))


@pytest.fixture(scope="module")
def heads(tmp_path_factory, deep_target):
    """layout name -> (directory, reference weights, layers read, norm_before_residual)."""
    root = tmp_path_factory.mktemp("eagle3")
    emb = deep_target.model.get_input_embeddings().weight.detach().float().clone()
    own = {**reference_weights("midlayer.", 1), "embed_tokens.weight": emb}  # the authors' files carry the table
    bin_w = reference_weights("midlayer.", 2)
    spec_w = reference_weights("layers.0.", 3)
    return {"eagle": (write_eagle(root / "eagle", own, "safetensors"), own, [2, 4, 5], False),
            "eagle-bin": (write_eagle(root / "eagle_bin", bin_w, "bin"), bin_w, [2, 4, 5], False),
            "speculators": (write_speculators(root / "spec", spec_w, True), spec_w, SPEC_LAYERS, True)}


def engine_for(target, path, tree=None):
    params = Eagle3Params(weights=path, tree=tree or HeadTreeParams(min_score=0.0))
    return Engine(target, n_ctx=512, n_seq_max=2, calibrate=False, drafter_params={"draft-eagle3": params})


# ---- an independent forward, from the reference equations (cnets.py LlamaDecoderLayeremb, Model) ----------------

def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def reference_layer(w: dict, p: str, x: torch.Tensor, tokens: torch.Tensor, emb: torch.Tensor, nbr: bool):
    """The midlayer over rows (feature x_j, token_j) at positions 0..n-1, causal: its outputs [n, H]."""
    n = x.shape[0]
    h = torch.cat([rms(emb[tokens], w[p + "input_layernorm.weight"]), rms(x, w[p + "hidden_norm.weight"])], -1)
    q = (h @ w[p + "self_attn.q_proj.weight"].T).view(n, HEADS, HD).transpose(0, 1)
    k = (h @ w[p + "self_attn.k_proj.weight"].T).view(n, KV, HD).transpose(0, 1)
    v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, KV, HD).transpose(0, 1)
    inv = 1.0 / THETA ** (torch.arange(0, HD, 2).float() / HD)
    ang = torch.arange(n).float()[:, None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rot(t):
        return t * cos + torch.cat([-t[..., HD // 2:], t[..., :HD // 2]], -1) * sin

    q, k = rot(q), rot(k)
    k, v = k.repeat_interleave(HEADS // KV, 0), v.repeat_interleave(HEADS // KV, 0)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(HD) + torch.full((n, n), -1e30).triu(1)
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, HEADS * HD)
    r = (rms(x, w[p + "hidden_norm.weight"]) if nbr else x) + attn @ w[p + "self_attn.o_proj.weight"].T
    y = rms(r, w[p + "post_attention_layernorm.weight"])
    mlp = (F.silu(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T))
    return r + mlp @ w[p + "mlp.down_proj.weight"].T


def reference_chain(w, p, target, tokens: list[int], layers, nbr: bool, n: int):
    """EAGLE-3's greedy chain after `tokens`: (target ids, top probabilities). Row j pairs the target's hidden
    states at j with token j + 1 (cnets.py feeds input_ids[:, 1:]); each draft feeds back its output."""
    emb = w.get("embed_tokens.weight", target.model.get_input_embeddings().weight.detach().float())
    with torch.no_grad():
        hs = target.model(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    x = torch.cat([hs[i][0].float() for i in layers], -1)[:-1] @ w["fc.weight"].T
    toks = torch.tensor(tokens[1:])
    out, ps = [], []
    for _ in range(n):
        g = reference_layer(w, p, x, toks, emb, nbr)[-1]
        probs = (rms(g, w["norm.weight"]) @ w["lm_head.weight"].T).softmax(-1)
        j = int(probs.argmax())
        out.append(j + int(w["d2t"][j]))
        ps.append(float(probs[j]))
        x, toks = torch.cat([x, g[None]]), torch.cat([toks, torch.tensor([out[-1]])])
    return out, ps


# ---- tests -------------------------------------------------------------------------------------------------------

def test_layouts_are_detected(heads, tmp_path):
    assert detect_layout(heads["eagle"][0]) == "eagle" and detect_layout(heads["eagle-bin"][0]) == "eagle"
    assert detect_layout(heads["speculators"][0]) == "speculators"
    save_tiny(tmp_path / "plain", seed=0)
    assert not is_eagle3_dir(tmp_path / "plain") and not is_eagle3_dir(tmp_path / "missing")


@pytest.mark.parametrize("layout", ["eagle", "eagle-bin", "speculators"])
def test_the_drafted_chain_is_the_reference_forwards(heads, deep_target, layout):
    path, w, layers, nbr = heads[layout]
    prefix = "layers.0." if layout == "speculators" else "midlayer."
    engine = engine_for(deep_target, path)
    d = engine.drafter("draft-eagle3")
    assert d.hidden_layers == tuple(layers) and engine.ctx.hidden_layers == tuple(layers)
    for prompt in PROMPTS:
        engine.start(prompt, GenParams(max_new_tokens=2), seq=0)
        engine.step()  # the prefill: the head has the target's features of every prompt position
        r = DraftRequest(seq=0, prompt=prompt[:-1], id_last=prompt[-1], n_max=4, n_min=0, p_min=0.0)
        d.draft([r])
        want, p_want = reference_chain(w, prefix, deep_target, prompt, layers, nbr, 4)
        assert r.result == want
        assert r.result_p == pytest.approx(p_want, abs=1e-4)
        engine.release(0)


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
@pytest.mark.parametrize("tree", [False, True])
def test_chains_and_trees_are_lossless_and_drafted(heads, deep_target, layout, tree):
    engine = engine_for(deep_target, heads[layout][0])
    drafted = 0
    for prompt in PROMPTS:
        spec = SpecParams(types=["draft-eagle3"], n_max=4, adaptive=False, p_min=0.0, tree_nodes=8 if tree else 0)
        params = GenParams(max_new_tokens=24, ignore_eos=True, sampling=SamplerParams(temp=0.0), spec=spec)
        events = list(engine.generate(prompt, params))
        plain = list(engine.generate(prompt, GenParams(max_new_tokens=24, ignore_eos=True)))
        assert [t for e in events for t in e.emitted] == [t for e in plain for t in e.emitted]
        if tree:
            drafted += sum(e.tree_drafters.count("draft-eagle3") for e in events)
        else:
            drafted += sum(len(e.drafted) for e in events if e.drafter == "draft-eagle3")
    assert drafted > 0, "the EAGLE-3 head proposed nothing"


def test_a_head_for_another_width_is_refused_with_the_reason(deep_target, tmp_path):
    narrow = write_eagle(tmp_path / "narrow", reference_weights("midlayer.", 4, hidden=32), "safetensors", hidden=32)
    engine = engine_for(deep_target, narrow)
    with pytest.raises(ValueError, match="hidden size is 32, the target's is 64"):
        engine.drafter("draft-eagle3")
    with pytest.raises(ValueError, match="EAGLE-3 checkpoint directory"):
        Engine(deep_target, n_ctx=64, n_seq_max=1, calibrate=False).drafter("draft-eagle3")


def test_unknown_tensors_are_refused(heads, deep_target, tmp_path):
    w = {**heads["eagle-bin"][1], "midlayer.self_attn.q_proj.bias": torch.zeros(HEADS * HD)}
    with pytest.raises(ValueError, match="unexpected tensors midlayer.self_attn.q_proj.bias"):
        engine_for(deep_target, write_eagle(tmp_path / "mixed", w, "safetensors")).drafter("draft-eagle3")


def test_bench_draft_dir_of_an_eagle3_head_drafts_as_draft_eagle3(heads, bench_prompts):
    from engine.bench.cli import parse_args
    from engine.bench.run import BenchConfig

    path = str(heads["speculators"][0])
    a = parse_args(["--prompts", str(bench_prompts), "--draft", path, "--spec", "ngram-simple,draft-simple"])
    cfg = BenchConfig.from_args(a, n_max=4, parallel=1, ctx_len=0)
    assert cfg.spec.types == ["ngram-simple", "draft-eagle3"] and cfg.draft_is_eagle3



def test_the_app_offers_a_draft_dir_of_an_eagle3_head_as_draft_eagle3(heads, deep_target):
    import app
    from ui.loader import make_runtime
    from ui.state import AppOptions

    path = str(heads["eagle"][0])
    assert app.parse_args(["--draft", path]).draft == path
    runtime = make_runtime(deep_target, None, AppOptions(n_ctx=256, parallel=1, eagle3=path))
    assert runtime.draft is None and runtime.engine.drafter("draft-eagle3").hidden_layers == (2, 4, 5)


def test_two_drafters_of_hidden_states_each_read_their_own_layers():
    """The context keeps the union of the layers its drafters ask for; each reads only its own, in its order."""
    from engine.memory.context import DecodeResult

    width, layers = 4, (2, 5, 7)
    hidden = torch.cat([torch.full((3, width), float(i)) for i in layers], dim=-1)
    res = DecodeResult(logits=None, seconds=0.0, hidden=hidden, layers=layers)
    assert res.hidden_of(layers) is hidden
    mine = res.hidden_of((7, 2))
    assert mine.shape == (3, 2 * width) and mine[0, :width].eq(7).all() and mine[0, width:].eq(2).all()
    with pytest.raises(ValueError, match="not kept"):
        res.hidden_of((3,))
