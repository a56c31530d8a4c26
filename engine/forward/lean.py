"""A lean forward on the cell cache for the families users bring, reading the HF model's own modules (gpt-fast's
idea).

transformers' forward is written for every feature of every model; for one decode step of a small model its
bookkeeping (mask builders, kwargs plumbing, output records, dtype round trips) is a large share of the step.
This forward does only what the decoder needs, as engine/forward/layer_spec.py describes it per layer, with
fused oneDNN or own-kernel calls (o_proj + residual, gate + silu, up * gate, down + residual:
engine/forward/prepack.py), and reads the same weights, so there is one copy of them and every other user of the
model (generate, training, a recurrent cache) keeps transformers' forward.

Per layer, x [T, D] the residual stream of the batch rows (Llama's pre-norm layout; Gemma's adds a norm on
each branch's output before its residual add, OLMo 2's has only those):
    h = norm_in(x);  q, k, v = h Wq, h Wk, h Wv;  q, k = rope(q_norm(q)), rope(k_norm(k))
    cells <- k, v;  a = attention of q over the cells the row sees in this layer's kind (engine/forward/attention.py)
    x = x + a Wo;  h = norm_mlp(x);  x = x + (act(h Wg) * h Wu) Wd
Norms follow transformers' RMSNorm of each family; rotary tables come from the model's own rotary module (per
layer kind where it has several), so every rope scaling it knows is kept.

Where the model is float32 on our own linear kernel, all the layers run in one C call instead
(engine/forward/lean_fused.py, which says where it steps aside): the same kernels without the ~40 torch calls a
layer makes here.

Families: layer_spec.FAMILIES. Anything else, or linears that are not prepacked (a GPU, a torch without oneDNN),
runs transformers' forward: `lean_reason` says why.
"""

from __future__ import annotations

import torch

from engine.forward import prepack
from engine.forward.attention import LayerRows
from engine.forward.kernels import registry
from engine.forward.layer_spec import FAMILIES, family_reason, model_spec, rms, softcap
from engine.forward.lean_fused import FusedLayers

__all__ = ["FAMILIES", "LeanForward", "family_reason", "lean_reason"]


def lean_reason(model) -> str | None:
    """None if `model` can run the lean forward, else why it runs transformers' forward."""
    why = family_reason(model)
    if why is not None:
        return why
    linears = [model.lm_head] + [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    if not all(prepack.is_packed(m) for m in linears):
        return "linears are not prepacked (not a CPU with oneDNN, or a dtype it does not pack)"
    return None


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, H, D]; cos, sin [T, 1, R] (both halves equal, as the rotary module returns them), R <= D: a table
    narrower than the head rotates its first R (Phi-3's partial rotary) and passes the rest."""
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat((_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)
    half = r // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _lin(x3: torch.Tensor, wb: tuple, post: str = "none") -> torch.Tensor:
    return prepack.packed_linear(wb[0], wb[1], x3, post)


def _lin_then(x3: torch.Tensor, other: torch.Tensor, wb: tuple, op: str) -> torch.Tensor:
    return prepack.packed_linear(wb[0], wb[1], x3, op, other)


class LeanForward:
    """Runs a model of the lean families on the cell cache; built once per model by ModelContext.

    The residual stream is [1, T', D] in the model's dtype with T' >= 2: a single row runs as two identical
    rows, so every linear takes the batched oneDNN kernel (prepack._rows3 says why) with one copy per layer
    instead of one per call. Attention runs in float32 over a float32 cache (cache_dtype): torch's bfloat16
    SDPA is several times slower on the CPU, and float32 keys lose nothing."""

    cache_dtype = torch.float32

    def __init__(self, model):
        self.model = model
        self.inner = model.model
        self.spec = model_spec(model)
        self.layers = self.spec.layers
        self.n_layers = len(self.layers)
        self.dtype = self.inner.embed_tokens.weight.dtype
        self.kinds = tuple(dict.fromkeys(layer.kind for layer in self.layers))
        # all layers in one C call where the model is float32 on our kernels (engine/forward/lean_fused.py)
        self.fused, self.fused_reason = FusedLayers.build(self)

    def _rotary(self, x: torch.Tensor, position_ids: torch.Tensor) -> dict:
        """{layer kind: (cos, sin) [T, hd]}: Gemma 3's local and global layers rotate with bases of their own."""
        empty = x.new_empty(0, dtype=torch.float32)
        if not self.spec.rotary_by_kind:
            cos, sin = self.inner.rotary_emb(empty, position_ids[None])
            return {kind: (cos[0], sin[0]) for kind in self.kinds}
        tables = {kind: self.inner.rotary_emb(empty, position_ids[None], kind) for kind in self.kinds}
        return {kind: (cos[0], sin[0]) for kind, (cos, sin) in tables.items()}

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache, cell_rows, rows: torch.Tensor,
                 hidden_layers: tuple[int, ...]):
        """input_ids, position_ids [T]; cell_rows: attention.CellRows, or LayerRows where kinds see different
        cells; rows [n_out] -> (logits [n_out, V], hidden).

        hidden: [T, len(hidden_layers) * D] with transformers' hidden_states numbering (0 the embeddings, i the
        output of layer i, n_layers the final norm), or None when no layer is asked for."""
        x = self.inner.embed_tokens(input_ids)  # [T, D]
        rotary = self._rotary(x, position_ids)
        kept = {0: x.clone()} if 0 in hidden_layers else {}  # the C layers change x in place
        inner = [i for i in hidden_layers if 0 < i < self.n_layers]
        side = None  # [T, len(hidden_layers) * D] where the C call wrote exactly the layers asked, side by side
        if self.fused is not None and self.fused.applies(cache, cell_rows):
            x, written = self.fused(x.float().contiguous(), rotary, cache, cell_rows, inner)
            if written is not None and tuple(inner) == tuple(hidden_layers):
                side = written  # a drafter's features every forward: no slicing and copying into a second tensor
            d = x.shape[1]
            after = {} if side is not None else {i: written[:, j * d:(j + 1) * d] for j, i in enumerate(inner)}
        else:
            x, after = self._torch_layers(x, rotary, cache, cell_rows, inner)
        kept.update(after)
        final = self.spec.final_norm
        if self.n_layers in hidden_layers:
            kept[self.n_layers] = rms(x, final)
        logits = softcap(prepack.linear(self.model.lm_head, rms(x[rows], final)), self.spec.final_softcap)
        if side is None and hidden_layers:
            side = torch.cat([kept[i] for i in hidden_layers], dim=-1)
        return logits, side

    def rotary_width(self) -> int | None:
        """The width of the rotary table (the head's, or less for a partial rotary); None where no layer rotates."""
        if not any(layer.rope for layer in self.layers):
            return None
        cos, _ = next(iter(self._rotary(torch.zeros(1, 1), torch.zeros(1, dtype=torch.long)).values()))
        return int(cos.shape[-1])

    def describe(self) -> str:
        entry = registry.LIBRARIES["lean_layers"]
        return entry.runs if self.fused is not None else f"{entry.fallback}: {self.fused_reason}"

    def _torch_layers(self, x, rotary: dict, cache, cell_rows, inner: list[int]):
        """x [T, D]; rotary {kind: (cos, sin) [T, hd]} -> (x after the last layer [T, D], {layer: x after it} for
        `inner`)."""
        t = x.shape[0]
        x = (x.expand(2, -1) if t == 1 else x).reshape(1, max(t, 2), -1).contiguous()  # [1, T', D]
        rotary = {kind: (cos[:, None, :], sin[:, None, :]) for kind, (cos, sin) in rotary.items()}  # [T, 1, hd]
        kept = {}
        for i, layer in enumerate(self.layers):
            rows = cell_rows.by_kind[cell_rows.types[i]] if isinstance(cell_rows, LayerRows) else cell_rows
            x = self._layer(i, layer, x, t, *rotary[layer.kind], cache, rows)
            if i + 1 in inner:
                kept[i + 1] = x[0, :t]
        return x[0, :t], kept

    def _layer(self, i: int, w, x, t: int, cos, sin, cache, cell_rows) -> torch.Tensor:
        """x [1, T', D] -> [1, T', D]; the first t rows are real. w: the layer's LayerSpec."""
        hd = w.head_dim
        h = x if w.norm_in is None else rms(x, w.norm_in)
        if w.qkv is not None:  # Phi-3: q, k, v from one linear
            q, k, v = _lin(h, w.qkv)[0, :t].float().split(
                [w.n_heads * hd, w.n_kv_heads * hd, w.n_kv_heads * hd], dim=-1)
        else:
            q, k, v = _lin(h, w.q)[0, :t].float(), _lin(h, w.k)[0, :t].float(), _lin(h, w.v)[0, :t].float()
        if w.q_norm is not None and not w.qk_norm_per_head:  # OLMo 2: over the whole projection
            q, k = rms(q, w.q_norm), rms(k, w.k_norm)
        q, k, v = q.reshape(t, -1, hd), k.reshape(t, -1, hd), v.reshape(t, -1, hd)  # [T, H, hd], [T, H_kv, hd]
        if w.q_norm is not None and w.qk_norm_per_head:  # Qwen3, Gemma 3: over each head
            q, k = rms(q, w.q_norm), rms(k, w.k_norm)
        if w.rope:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        keys, values = cache.update(k.transpose(0, 1)[None], v.transpose(0, 1)[None], i)  # [1, H_kv, n_live, hd]
        a = cell_rows.attend(q, keys, values, w.scaling, w.softcap).reshape(1, t, -1).to(self.dtype)  # [1, T, H*hd]
        if t == 1:
            a = a.expand(1, 2, -1).contiguous()
        if w.norm_attn_out is None:
            x = _lin_then(a, x, w.o, "add")
        else:
            x = x + rms(_lin(a, w.o), w.norm_attn_out)
        h = x if w.norm_mlp is None else rms(x, w.norm_mlp)
        if w.gate_up is not None:  # Phi-3: gate and up from one linear, the gate's half first
            gate, up = _lin(h, w.gate_up).chunk(2, dim=-1)
            g = up * _act(gate, w.act)
        else:
            gate = _lin(h, w.gate, "swish") if w.act == "silu" else _act(_lin(h, w.gate), w.act)
            g = _lin_then(h, gate, w.up, "mul")
        if w.norm_mlp_out is None:
            return _lin_then(g, x, w.down, "add")
        return x + rms(_lin(g, w.down), w.norm_mlp_out)


def _act(x: torch.Tensor, act: str) -> torch.Tensor:
    if act == "silu":
        return torch.nn.functional.silu(x)
    return torch.nn.functional.gelu(x, approximate="tanh")
