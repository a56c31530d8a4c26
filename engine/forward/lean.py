"""A lean forward for the Llama family on the cell cache, reading the HF model's own modules (gpt-fast's idea).

transformers' forward is written for every feature of every model; for one decode step of a small model its
bookkeeping (mask builders, kwargs plumbing, output records, dtype round trips) is a large share of the step.
This forward does only what a Llama-shaped decoder needs, with three fused oneDNN calls per layer
(o_proj + residual, gate + silu, up * gate, down + residual: engine/forward/prepack.py), and reads the same weights, so
there is one copy of them and every other user of the model (generate, training, a recurrent cache) keeps
transformers' forward.

Per layer, x [T, D] the residual stream of the batch rows:
    h = rms(x) * w_in;  q, k, v = h Wq, h Wk, h Wv;  q, k = rope(q), rope(k)   (q_norm/k_norm first for Qwen3)
    cells <- k, v;  a = attention of q over the cells each row's sequence sees (engine/forward/attention.py)
    x = x + a Wo;  h = rms(x) * w_post;  x = x + (silu(h Wg) * h Wu) Wd
Norms follow transformers' RMSNorm (float32 inside, weight applied in the model dtype); rotary tables come
from the model's own rotary module, so every rope scaling it knows is kept.

Where the model is float32 on our own linear kernel, all the layers run in one C call instead
(engine/forward/lean_fused.py): the same kernels without the ~40 torch calls a layer makes here.

Families: llama, mistral, qwen2, qwen3 with silu MLPs and every layer attending the same way (all full, or all
sliding, which the cell cache's mask covers). Anything else, or linears that are not prepacked (a GPU, a torch
without oneDNN), runs transformers' forward: `lean_reason` says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.forward import prepack
from engine.forward.kernels import registry
from engine.forward.lean_fused import FusedLayers

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def lean_reason(model) -> str | None:
    """None if `model` can run the lean forward, else why it runs transformers' forward."""
    why = family_reason(model)
    if why is not None:
        return why
    inner = model.model
    linears = [model.lm_head]
    for layer in inner.layers:
        att, mlp = layer.self_attn, layer.mlp
        linears += [att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    if not all(prepack.is_packed(m) for m in linears):
        return "linears are not prepacked (not a CPU with oneDNN, or a dtype it does not pack)"
    return None


def family_reason(model) -> str | None:
    """None if `model` is of a family and layout the lean forward implements, else why not."""
    cfg = model.config
    kind = getattr(cfg, "model_type", "")
    if kind not in FAMILIES:
        return f"{kind or type(model).__name__} runs transformers' forward (lean forward: {', '.join(FAMILIES)})"
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return "activation or tensor-parallel layout the lean forward does not implement"
    layer_types = set(getattr(cfg, "layer_types", None) or ())
    if len(layer_types) > 1:
        return f"layers of several attention kinds ({', '.join(sorted(layer_types))})"
    inner = getattr(model, "model", None)
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")) or \
            not hasattr(model, "lm_head"):
        return "module layout differs from transformers' Llama"
    return None


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos, sin [T, 1, D] (both halves equal, as the rotary module returns them)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@dataclass
class _Layer:
    """One decoder layer's tensors, fetched once (nn.Module attribute lookups cost microseconds each)."""
    w_in: torch.Tensor  # input RMSNorm weight [D]
    w_post: torch.Tensor  # post-attention RMSNorm weight [D]
    q: tuple  # (packed weight, bias or None) of q_proj; k, v, o, gate, up, down likewise
    k: tuple
    v: tuple
    o: tuple
    gate: tuple
    up: tuple
    down: tuple
    q_norm: tuple | None  # (weight [hd], eps) of Qwen3's per-head norms; None elsewhere
    k_norm: tuple | None
    head_dim: int
    scaling: float


def _packed(module) -> tuple:
    return module._packed_weight, module.bias


def _norm(module) -> tuple | None:
    return None if module is None else (module.weight, module.variance_epsilon)


def _lin(x3: torch.Tensor, wb: tuple, post: str = "none") -> torch.Tensor:
    return prepack.packed_linear(wb[0], wb[1], x3, post)


def _lin_then(x3: torch.Tensor, other: torch.Tensor, wb: tuple, op: str) -> torch.Tensor:
    return prepack.packed_linear(wb[0], wb[1], x3, op, other)


class LeanForward:
    """Runs a Llama-family model on the cell cache; built once per model by ModelContext.

    The residual stream is [1, T', D] in the model's dtype with T' >= 2: a single row runs as two identical
    rows, so every linear takes the batched oneDNN kernel (prepack._rows3 says why) with one copy per layer
    instead of one per call. Attention runs in float32 over a float32 cache (cache_dtype): torch's bfloat16
    SDPA is several times slower on the CPU, and float32 keys lose nothing."""

    cache_dtype = torch.float32

    def __init__(self, model):
        self.model = model
        self.inner = model.model
        self.eps = float(getattr(model.config, "rms_norm_eps", 1e-6))
        self.n_layers = len(self.inner.layers)
        self.dtype = self.inner.embed_tokens.weight.dtype
        self.layers = []
        for layer in self.inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            self.layers.append(_Layer(
                w_in=layer.input_layernorm.weight, w_post=layer.post_attention_layernorm.weight,
                q=_packed(att.q_proj), k=_packed(att.k_proj), v=_packed(att.v_proj), o=_packed(att.o_proj),
                gate=_packed(mlp.gate_proj), up=_packed(mlp.up_proj), down=_packed(mlp.down_proj),
                q_norm=_norm(getattr(att, "q_norm", None)), k_norm=_norm(getattr(att, "k_norm", None)),
                head_dim=int(att.head_dim), scaling=float(att.scaling)))
        # all layers in one C call where the model is float32 on our kernels (engine/forward/lean_fused.py)
        self.fused, self.fused_reason = FusedLayers.build(self)

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache, cell_rows, rows: torch.Tensor,
                 hidden_layers: tuple[int, ...]):
        """input_ids, position_ids [T]; cell_rows: attention.CellRows; rows [n_out] -> (logits [n_out, V],
        hidden).

        hidden: [T, len(hidden_layers) * D] with transformers' hidden_states numbering (0 the embeddings, i the
        output of layer i, n_layers the final norm), or None when no layer is asked for."""
        x = self.inner.embed_tokens(input_ids)  # [T, D]
        cos, sin = self.inner.rotary_emb(x.new_empty(0, dtype=torch.float32), position_ids[None])  # [1, T, hd]
        kept = {0: x.clone()} if 0 in hidden_layers else {}  # the C layers change x in place
        inner = [i for i in hidden_layers if 0 < i < self.n_layers]
        side = None  # [T, len(hidden_layers) * D] where the C call wrote exactly the layers asked, side by side
        if self.fused is not None and self.fused.applies(cache, cell_rows):
            x, written = self.fused(x.float().contiguous(), cos[0].contiguous(), sin[0].contiguous(), cache,
                                    cell_rows, inner)
            if written is not None and tuple(inner) == tuple(hidden_layers):
                side = written  # a drafter's features every forward: no slicing and copying into a second tensor
            d = x.shape[1]
            after = {} if side is not None else {i: written[:, j * d:(j + 1) * d] for j, i in enumerate(inner)}
        else:
            x, after = self._torch_layers(x, cos[0][:, None, :], sin[0][:, None, :], cache, cell_rows, inner)
        kept.update(after)
        norm = self.inner.norm.weight
        if self.n_layers in hidden_layers:
            kept[self.n_layers] = _rms(x, norm, self.eps)
        logits = prepack.linear(self.model.lm_head, _rms(x[rows], norm, self.eps))
        if side is None and hidden_layers:
            side = torch.cat([kept[i] for i in hidden_layers], dim=-1)
        return logits, side

    def describe(self) -> str:
        entry = registry.LIBRARIES["lean_layers"]
        return entry.runs if self.fused is not None else f"{entry.fallback}: {self.fused_reason}"

    def _torch_layers(self, x, cos, sin, cache, cell_rows, inner: list[int]):
        """x [T, D]; cos, sin [T, 1, hd] -> (x after the last layer [T, D], {layer: x after it} for `inner`)."""
        t = x.shape[0]
        x = (x.expand(2, -1) if t == 1 else x).reshape(1, max(t, 2), -1).contiguous()  # [1, T', D]
        kept = {}
        for i, layer in enumerate(self.layers):
            x = self._layer(i, layer, x, t, cos, sin, cache, cell_rows)
            if i + 1 in inner:
                kept[i + 1] = x[0, :t]
        return x[0, :t], kept

    def _layer(self, i: int, w: _Layer, x, t: int, cos, sin, cache, cell_rows) -> torch.Tensor:
        """x [1, T', D] -> [1, T', D]; the first t rows are real."""
        hd = w.head_dim
        h = _rms(x, w.w_in, self.eps)
        q = _lin(h, w.q)[0, :t].float().view(t, -1, hd)  # [T, H, hd]
        k = _lin(h, w.k)[0, :t].float().view(t, -1, hd)  # [T, H_kv, hd]
        v = _lin(h, w.v)[0, :t].float().view(t, -1, hd)
        if w.q_norm is not None:  # Qwen3: RMSNorm over each head before rope
            q, k = _rms(q, *w.q_norm), _rms(k, *w.k_norm)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        keys, values = cache.update(k.transpose(0, 1)[None], v.transpose(0, 1)[None], i)  # [1, H_kv, n_live, hd]
        a = cell_rows.attend(q, keys, values, w.scaling).reshape(1, t, -1).to(self.dtype)  # [1, T, H * hd]
        if t == 1:
            a = a.expand(1, 2, -1).contiguous()
        x = _lin_then(a, x, w.o, "add")
        h = _rms(x, w.w_post, self.eps)
        gate = _lin(h, w.gate, "swish")
        return _lin_then(_lin_then(h, gate, w.up, "mul"), x, w.down, "add")
