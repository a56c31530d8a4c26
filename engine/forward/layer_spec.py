"""A decoder described per layer for the lean forward: its norms and where they sit, its activation, its attention
kind (which cells it sees and which rotary table it takes), soft-capping and the head; read once from
transformers' own modules, which keep the weights.

Two layouts cover the families the lean forward runs (transformers' modeling_llama.py and modeling_gemma3.py):

    pre-norm (Llama 3, Mistral, Qwen2/2.5, Qwen3, SmolLM2):
        x = x + attn(norm_in(x));                  x = x + mlp(norm_mlp(x))
    sandwich (Gemma 2, Gemma 3):
        x = x + norm_attn_out(attn(norm_in(x)));   x = x + norm_mlp_out(mlp(norm_mlp(x)))

Gemma's RMSNorm multiplies by (1 + w) in float32 and then casts; Llama's casts and then multiplies by w
(transformers PR 29402): `Norm.scale_in_float32` keeps each one's rounding, so bfloat16 models stay exact too.
Gemma scales the embeddings by sqrt(D) inside its embedding module, which the lean forward calls, and Gemma 2
soft-caps attention scores and logits (c * tanh(s / c)); Gemma 3 and Qwen3 norm each head's q and k.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PRE_NORM = ("llama", "mistral", "qwen2", "qwen3")
SANDWICH = ("gemma2", "gemma3_text")
FAMILIES = PRE_NORM + SANDWICH
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # SiLU fuses into the gate's linear; GELU (tanh form) runs after it


@dataclass(frozen=True)
class Norm:
    """One RMSNorm: y = rms(x) * weight, the product taken in float32 then cast (Gemma) or after the cast."""
    weight: torch.Tensor  # [D] or [head_dim]; Gemma's (1 + w), float32, made once here
    eps: float
    scale_in_float32: bool


@dataclass
class LayerSpec:
    """One decoder layer's tensors and rules, fetched once (nn.Module attribute lookups cost microseconds each)."""
    norm_in: Norm  # before attention
    norm_attn_out: Norm | None  # on attention's output before the residual add (sandwich only)
    norm_mlp: Norm  # before the MLP
    norm_mlp_out: Norm | None  # on the MLP's output before the residual add (sandwich only)
    q_norm: Norm | None  # per head, before rotary (Qwen3, Gemma 3)
    k_norm: Norm | None
    q: tuple  # (packed weight, bias or None) of q_proj; k, v, o, gate, up, down likewise
    k: tuple
    v: tuple
    o: tuple
    gate: tuple
    up: tuple
    down: tuple
    act: str  # one of ACTIVATIONS
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
    return None


def _activation(cfg) -> str:
    return getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")


def _norm(module, sandwich: bool) -> Norm | None:
    if module is None:
        return None
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
    if sandwich:
        return Norm((1.0 + module.weight.detach().float()).contiguous(), eps, True)
    return Norm(module.weight, eps, False)


def _packed(module) -> tuple:
    return module._packed_weight, module.bias


def model_spec(model) -> ModelSpec:
    """The spec of a model `family_reason` accepts, its linears prepacked (engine/forward/prepack.py)."""
    cfg = model.config
    sandwich = cfg.model_type in SANDWICH
    types = getattr(cfg, "layer_types", None)
    layers = []
    for i, layer in enumerate(model.model.layers):
        att, mlp = layer.self_attn, layer.mlp
        layers.append(LayerSpec(
            norm_in=_norm(layer.input_layernorm, sandwich),
            norm_attn_out=_norm(layer.post_attention_layernorm, sandwich) if sandwich else None,
            norm_mlp=_norm(layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm,
                           sandwich),
            norm_mlp_out=_norm(layer.post_feedforward_layernorm, sandwich) if sandwich else None,
            q_norm=_norm(getattr(att, "q_norm", None), sandwich), k_norm=_norm(getattr(att, "k_norm", None), sandwich),
            q=_packed(att.q_proj), k=_packed(att.k_proj), v=_packed(att.v_proj), o=_packed(att.o_proj),
            gate=_packed(mlp.gate_proj), up=_packed(mlp.up_proj), down=_packed(mlp.down_proj),
            act=_activation(cfg), kind=types[i] if types else None, head_dim=int(att.head_dim),
            scaling=float(att.scaling), softcap=getattr(att, "attn_logit_softcapping", None)))
    rotary = model.model.rotary_emb
    return ModelSpec(layers=layers, final_norm=_norm(model.model.norm, sandwich),
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
