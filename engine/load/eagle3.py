"""EAGLE-3 draft heads (Li et al., arXiv:2503.01840) in their two published layouts, read into one form.

The layouts, as their reference code defines them (read for the names and equations; no code taken):
- the EAGLE authors' (github.com/SafeAILab/EAGLE, eagle/model/cnets.py, class Model): a LlamaConfig-like
  config.json with `draft_vocab_size`; weights `fc.weight`, `midlayer.*` (one Llama decoder layer whose q/k/v
  read 2*hidden inputs, with an extra `hidden_norm`), `norm.weight`, `lm_head.weight`, the buffers `d2t` and
  `t2d`, and `embed_tokens.weight` when the head carries its own table; in pytorch_model.bin or
  model.safetensors. The target hidden states it fuses are the inputs of layers 2, n//2 and n-3
  (eagle/model/modeling_llama_kv.py), i.e. transformers' hidden_states[2], [n//2], [n-3], not normed.
- vllm-project/speculators (src/speculators/models/eagle3/config.py, core.py, model_definitions.py): config.json
  with `speculators_model_type: "eagle3"`, the layer's settings under `transformer_layer_config`,
  `draft_vocab_size`, `norm_before_residual` and optionally `eagle_aux_hidden_state_layer_ids` (same numbering);
  the same weights with the layer under `layers.0.` (vLLM's vllm/model_executor/models/llama_eagle3.py maps
  `midlayer.` to `layers.0.` when it loads the authors' files).
In both, `d2t[i]` is an offset: draft id i proposes target id i + d2t[i].

Only data is read: safetensors, or torch.load(weights_only=True); no code from the checkpoint ever runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

# the decoder layer's tensors: reference name inside the layer -> the draft head's name (engine/draft/head/net.py)
LAYER_KEYS = {
    "self_attn.q_proj.weight": "q_proj.weight",
    "self_attn.k_proj.weight": "k_proj.weight",
    "self_attn.v_proj.weight": "v_proj.weight",
    "self_attn.o_proj.weight": "o_proj.weight",
    "input_layernorm.weight": "emb_norm.weight",  # normalises the token embedding
    "hidden_norm.weight": "feat_norm.weight",  # normalises the fused (or fed back) feature
    "post_attention_layernorm.weight": "post_norm.weight",
    "mlp.gate_proj.weight": "gate.weight",
    "mlp.up_proj.weight": "up.weight",
    "mlp.down_proj.weight": "down.weight",
}
TOP_KEYS = {"fc.weight": "fc.weight", "norm.weight": "norm.weight", "lm_head.weight": "lm_head.weight"}
OPTIONAL_KEYS = {"d2t": "d2t", "embed_tokens.weight": "embed"}  # d2t is absent where both vocabularies agree
IGNORED_KEYS = {"t2d"}  # the inverse mask of d2t: nothing the drafter needs
LAYER_PREFIX = {"eagle": "midlayer.", "speculators": "layers.0."}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass
class Eagle3Checkpoint:
    layout: str  # "eagle" (the authors') or "speculators"
    hidden: int  # width of the head, and of each target hidden state it fuses
    n_heads: int  # attention heads
    n_kv_heads: int  # key/value heads
    head_dim: int  # per-head width
    intermediate: int  # gated MLP width
    draft_vocab: int  # rows of the head's LM head
    target_vocab: int  # the target vocabulary it was trained for
    rms_eps: float  # norm epsilon
    rope: dict  # rope_theta and any rope scaling, as the config gives them (transformers' names)
    layers: tuple[int, ...] | None  # transformers' hidden_states indices fused; None: 2, n//2, n-3 of the target
    norm_before_residual: bool  # speculators' option: the residual is the normed feature, not the raw one
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # the head's names (LAYER_KEYS, TOP_KEYS, d2t)
    embed: torch.Tensor | None = None  # the head's own token embedding table, when it carries one


def _config(path: Path) -> dict | None:
    f = path / "config.json"
    if not path.is_dir() or not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def _weights_file(path: Path) -> Path | None:
    return next((path / n for n in WEIGHT_FILES if (path / n).is_file()), None)


def _read_tensors(f: Path) -> dict[str, torch.Tensor]:
    if f.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(f))
    state = torch.load(str(f), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{f}: not a state dict of tensors")
    return state


def detect_layout(path: Path | str) -> str | None:
    """"speculators", "eagle" or None (not an EAGLE-3 checkpoint directory). The config decides: speculators
    name their model type; the authors' config is a LlamaConfig with a draft vocabulary, whose weights hold
    `fc.weight` and the `midlayer.` layer (only the names are read from a safetensors file)."""
    path = Path(path)
    cfg = _config(path)
    if cfg is None or _weights_file(path) is None:
        return None
    if "speculators_model_type" in cfg:
        return "speculators" if cfg["speculators_model_type"] == "eagle3" else None
    if "draft_vocab_size" not in cfg:
        return None
    f = _weights_file(path)
    if f.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(f), framework="pt") as sf:
            keys = set(sf.keys())
    else:
        keys = set(_read_tensors(f))
    return "eagle" if "fc.weight" in keys and any(k.startswith("midlayer.") for k in keys) else None


def is_eagle3_dir(path: Path | str | None) -> bool:
    return path is not None and detect_layout(path) is not None


def _shape_from(layer: dict, top: dict, layout: str) -> dict:
    """The head's sizes from the layer's config (`layer`) and the draft-specific top level (`top`)."""
    heads = int(layer["num_attention_heads"])
    hidden = int(layer["hidden_size"])
    # the authors' attention always splits hidden evenly; speculators' Llama layer honours a head_dim
    head_dim = hidden // heads if layout == "eagle" else int(layer.get("head_dim") or hidden // heads)
    return dict(hidden=hidden, n_heads=heads, n_kv_heads=int(layer.get("num_key_value_heads") or heads),
                head_dim=head_dim, intermediate=int(layer["intermediate_size"]),
                target_vocab=int(layer["vocab_size"]),
                draft_vocab=int(top.get("draft_vocab_size") or layer["vocab_size"]),
                rms_eps=float(layer.get("rms_norm_eps", 1e-6)))


def _rope_of(layer: dict) -> dict:
    """rope_theta and scaling from either spelling (transformers 5's rope_parameters, or the older fields)."""
    params = dict(layer.get("rope_parameters") or {})
    scaling = layer.get("rope_scaling") or {}
    rope = {**scaling, **params}
    rope.setdefault("rope_theta", float(layer.get("rope_theta", 10000.0)))
    rope["rope_type"] = rope.get("rope_type") or rope.get("type") or "default"
    rope["max_position_embeddings"] = int(layer.get("max_position_embeddings", 2048))
    return rope


def _refuse_options(cfg: dict, layer: dict, layout: str) -> None:
    """What the draft head does not compute, refused by name rather than drafted wrongly."""
    target_hidden = cfg.get("target_hidden_size") or layer.get("target_hidden_size")
    if target_hidden and int(target_hidden) != int(layer["hidden_size"]):
        raise ValueError(f"EAGLE-3 checkpoint: a head of width {layer['hidden_size']} over target states of "
                         f"{target_hidden} is not supported")
    if layout == "speculators":
        for flag in ("norm_before_fc", "fc_norm", "norm_output"):
            if cfg.get(flag):
                raise ValueError(f"EAGLE-3 checkpoint: speculators option {flag} is not supported")
        if int(layer.get("num_hidden_layers", 1)) != 1:
            raise ValueError(f"EAGLE-3 checkpoint: {layer['num_hidden_layers']} decoder layers; only one is supported")
        if layer.get("model_type", "llama") != "llama":
            raise ValueError(f"EAGLE-3 checkpoint: a {layer['model_type']} decoder layer; only llama is supported")
    if layer.get("attention_bias") or layer.get("mlp_bias"):
        raise ValueError("EAGLE-3 checkpoint: biased projections are not supported")


def _map_tensors(state: dict[str, torch.Tensor], layout: str) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """Reference names -> the head's; refuses missing or unknown tensors (a wrong mapping fails loudly)."""
    prefix = LAYER_PREFIX[layout]
    names = {**TOP_KEYS, **OPTIONAL_KEYS, **{prefix + k: v for k, v in LAYER_KEYS.items()}}
    unknown = sorted(k for k in state if k not in names and k not in IGNORED_KEYS)
    if unknown:
        raise ValueError(f"EAGLE-3 checkpoint ({layout} layout): unexpected tensors {', '.join(unknown[:6])}")
    required = [k for k in names if k not in OPTIONAL_KEYS]
    missing = [k for k in required if k not in state]
    if missing:
        raise ValueError(f"EAGLE-3 checkpoint ({layout} layout): missing tensors {', '.join(missing[:6])}")
    out = {names[k]: (v.float() if v.is_floating_point() else v) for k, v in state.items()
           if k in names and names[k] != "embed"}
    return out, state.get("embed_tokens.weight")


def read_eagle3(path: Path | str) -> Eagle3Checkpoint:
    """The checkpoint in directory `path`, weights in float32 (the embedding table as stored); ValueError with
    the reason when it is not one this head can run."""
    path = Path(path)
    layout = detect_layout(path)
    if layout is None:
        raise ValueError(f"{path}: not an EAGLE-3 checkpoint directory (config.json with draft_vocab_size or "
                         f"speculators_model_type eagle3, and {' or '.join(WEIGHT_FILES)})")
    cfg = _config(path)
    layer = (cfg.get("transformer_layer_config") or {}) if layout == "speculators" else cfg
    _refuse_options(cfg, layer, layout)
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") if layout == "speculators" else None
    tensors, embed = _map_tensors(_read_tensors(_weights_file(path)), layout)
    return Eagle3Checkpoint(layout=layout, **_shape_from(layer, cfg, layout), rope=_rope_of(layer),
                            layers=tuple(int(i) for i in ids) if ids else None,
                            norm_before_residual=bool(cfg.get("norm_before_residual", False)),
                            tensors=tensors, embed=embed)
