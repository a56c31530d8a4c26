"""A decoder described per layer for the lean forward: its norms and where they sit, its activation, its attention
kind (which cells it sees and which rotary table it takes), soft-capping and the head; read once from
transformers' own modules, which keep the weights.

Three layouts cover the families the lean forward runs (transformers' modeling_llama.py, modeling_gemma3.py and
modeling_olmo2.py):

    pre-norm (Llama 3, Mistral, Qwen2/2.5, Qwen3, SmolLM2, SmolLM3, Phi-3):
        x = x + attn(norm_in(x));                  x = x + mlp(norm_mlp(x))
    sandwich (Gemma 2, Gemma 3):
        x = x + norm_attn_out(attn(norm_in(x)));   x = x + norm_mlp_out(mlp(norm_mlp(x)))
    post-norm (OLMo 2):
        x = x + norm_attn_out(attn(x));            x = x + norm_mlp_out(mlp(x))

Gemma's RMSNorm multiplies by (1 + w) in float32 and then casts, OLMo 2's by w in float32; Llama's casts and then
multiplies by w (transformers PR 29402): `Norm.scale_in_float32` keeps each one's rounding, so bfloat16 models
stay exact too. Gemma scales the embeddings by sqrt(D) inside its embedding module, which the lean forward calls,
and Gemma 2 soft-caps attention scores and logits (c * tanh(s / c)). Qwen3 and Gemma 3 norm each head's q and k,
OLMo 2 the whole q and k projections. SmolLM3 leaves rotary out of every fourth layer (`no_rope_layers`). Phi-3
keeps q, k, v in one linear and gate and up in another, and may rotate only a leading part of each head
(`partial_rotary_factor`: the rotary table is narrower than the head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PRE_NORM = ("llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3")
SANDWICH = ("gemma2", "gemma3_text")
POST_NORM = ("olmo2",)
FAMILIES = PRE_NORM + SANDWICH + POST_NORM
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # SiLU fuses into the gate's linear; GELU (tanh form) runs after it


@dataclass(frozen=True)
class Norm:
    """One RMSNorm: y = rms(x) * weight, the product taken in float32 then cast (Gemma) or after the cast."""
    weight: torch.Tensor  # [D], [head_dim] or a projection's width; Gemma's (1 + w), float32, made once here
    eps: float
    scale_in_float32: bool


@dataclass
class LayerSpec:
    """One decoder layer's tensors and rules, fetched once (nn.Module attribute lookups cost microseconds each)."""
    norm_in: Norm | None  # before attention (not in post-norm)
    norm_attn_out: Norm | None  # on attention's output before the residual add (sandwich, post-norm)
    norm_mlp: Norm | None  # before the MLP (not in post-norm)
    norm_mlp_out: Norm | None  # on the MLP's output before the residual add (sandwich, post-norm)
    q_norm: Norm | None  # before rotary: per head (Qwen3, Gemma 3) or over the whole projection (OLMo 2)
    k_norm: Norm | None
    qk_norm_per_head: bool
    q: tuple | None  # (packed weight, bias or None) of q_proj; k, v, o, gate, up, down likewise
    k: tuple | None
    v: tuple | None
    o: tuple
    gate: tuple | None
    up: tuple | None
    down: tuple
    qkv: tuple | None  # Phi-3's one linear for q, k and v (q, k, v None then), its rows in that order
    gate_up: tuple | None  # Phi-3's one linear for gate and up (gate, up None then), the gate's rows first
    n_heads: int
    n_kv_heads: int
    act: str  # one of ACTIVATIONS
    rope: bool  # False: the layer takes no rotary (SmolLM3's NoPE layers)
    kind: str | None  # config.layer_types' entry: the cells it sees and its rotary table; None: one for all
    head_dim: int
    scaling: float
    softcap: float | None  # attention scores become softcap * tanh(score / softcap)


@dataclass
class ModelSpec:
    layers: list[LayerSpec]
    final_norm: Norm
    final_softcap: float | None  # logits become c * tanh(logits / c) (Gemma 2)
    rotary_by_kind: bool  # the rotary module takes a layer kind (Gemma 3: local and global bases)


def family_reason(model) -> str | None:
    """None if `model` is of a family and layout the lean forward implements, else why not."""
    cfg = model.config
    kind = getattr(cfg, "model_type", "")
    if kind not in FAMILIES:
        return f"{kind or type(model).__name__} runs transformers' forward (lean forward: {', '.join(FAMILIES)})"
    act = _activation(cfg)
    if act not in ACTIVATIONS or getattr(cfg, "pretraining_tp", 1) != 1:
        return f"activation {act} or a tensor-parallel layout the lean forward does not implement"
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")) or \
            not hasattr(model, "lm_head"):
        return "module layout differs from transformers' Llama and Gemma"
    if kind in SANDWICH and not all(hasattr(layer, "pre_feedforward_layernorm") for layer in inner.layers):
        return "module layout differs from transformers' Gemma"
    if kind == "phi3" and not all(hasattr(layer.self_attn, "qkv_proj") for layer in inner.layers):
        return "module layout differs from transformers' Phi-3"
    return None


def _activation(cfg) -> str:
    return getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")


def _norm(module, family: str) -> Norm | None:
    if module is None:
        return None
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
    if family in SANDWICH:
        return Norm((1.0 + module.weight.detach().float()).contiguous(), eps, True)
    if family in POST_NORM:
        return Norm(module.weight.detach().float().contiguous(), eps, True)
    return Norm(module.weight, eps, False)


def _packed(module) -> tuple | None:
    return None if module is None else (module._packed_weight, module.bias)


def model_spec(model) -> ModelSpec:
    """The spec of a model `family_reason` accepts, its linears prepacked (engine/forward/prepack.py)."""
    cfg = model.config
    family = cfg.model_type
    types = getattr(cfg, "layer_types", None)
    no_rope = getattr(cfg, "no_rope_layers", None)  # SmolLM3: 1 where a layer rotates, 0 where it does not
    n_kv = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
    layers = []
    for i, layer in enumerate(model.model.layers):
        att, mlp = layer.self_attn, layer.mlp
        ln = {name: _norm(getattr(layer, name, None), family) for name in (
            "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")}
        if family in PRE_NORM:  # Llama's post_attention_layernorm is the MLP's input norm
            norms = (ln["input_layernorm"], None, ln["post_attention_layernorm"], None)
        elif family in SANDWICH:
            norms = (ln["input_layernorm"], ln["post_attention_layernorm"], ln["pre_feedforward_layernorm"],
                     ln["post_feedforward_layernorm"])
        else:
            norms = (None, ln["post_attention_layernorm"], None, ln["post_feedforward_layernorm"])
        layers.append(LayerSpec(
            norm_in=norms[0], norm_attn_out=norms[1], norm_mlp=norms[2], norm_mlp_out=norms[3],
            q_norm=_norm(getattr(att, "q_norm", None), family), k_norm=_norm(getattr(att, "k_norm", None), family),
            qk_norm_per_head=family not in POST_NORM,
            q=_packed(getattr(att, "q_proj", None)), k=_packed(getattr(att, "k_proj", None)),
            v=_packed(getattr(att, "v_proj", None)), o=_packed(att.o_proj),
            gate=_packed(getattr(mlp, "gate_proj", None)), up=_packed(getattr(mlp, "up_proj", None)),
            down=_packed(mlp.down_proj), qkv=_packed(getattr(att, "qkv_proj", None)),
            gate_up=_packed(getattr(mlp, "gate_up_proj", None)), n_heads=int(cfg.num_attention_heads),
            n_kv_heads=n_kv, act=_activation(cfg), rope=bool(no_rope[i]) if no_rope else True,
            kind=types[i] if types else None, head_dim=int(att.head_dim), scaling=float(att.scaling),
            softcap=getattr(att, "attn_logit_softcapping", None)))
    rotary = model.model.rotary_emb
    return ModelSpec(layers=layers, final_norm=_norm(model.model.norm, family),
                     final_softcap=getattr(cfg, "final_logit_softcapping", None),
                     rotary_by_kind=hasattr(rotary, "layer_types"))


def rms(x: torch.Tensor, norm: Norm) -> torch.Tensor:
    """transformers' RMSNorm of either family, with its rounding."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    if norm.scale_in_float32:
        return (x32 * norm.weight).to(x.dtype)
    return norm.weight * x32.to(x.dtype)


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    return x if cap is None else torch.tanh(x / cap) * cap
