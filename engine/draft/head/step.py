"""The draft head's dense pieces in C (engine/forward/kernels/head_step.c): fuse, q-k-v with its rotary embedding, the
attention output with the MLP, and the logits, one call each, over float16 weights or Q8_0 groups.

In torch each piece was a dozen small calls around its linears (at a few rows, several times the linears' own time;
docs/history.md#the-heads-own-costs), and a draft call makes five to ten of them. `HeadStep.build` returns one where
the head's linears are our float16-weight kernel (beside a float32 target on a CPU with F16C,
engine/forward/gemm.py); elsewhere (a bfloat16 target, oneDNN's linears, training) the head keeps its torch pieces.
Both give a row the same bits in any batch, so a sequence's tree is the one grown alone.
"""

from __future__ import annotations

import torch

from engine.forward.gemm import SmallGemm
from engine.forward.kernels import registry

# SmallGemm.label -> each piece's last argument: 1 where the weights are Q8_0 groups for the integer kernel
_KINDS = {"float16": 0, "q8_0_dot": 1}


def _packed(module) -> SmallGemm | None:
    w = getattr(module, "_packed_weight", None)
    return w if isinstance(w, SmallGemm) and w.label in _KINDS else None


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.float().contiguous()


def _rows(x: torch.Tensor, width: int, what: str) -> int:
    """x's rows, after checking it is [n, width]: the C pieces read n * width values from its pointer."""
    if x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"head step: {what} of shape {tuple(x.shape)}, expected [n, {width}]")
    return x.shape[0]


class HeadStep:
    def __init__(self, lib, head, linears: dict[str, SmallGemm]):
        self.fns = {fn.name: getattr(lib, fn.name) for fn in registry.LIBRARIES["head_step"].functions}
        self.head = head
        self.w = linears
        self.dot = _KINDS[next(iter(linears.values())).label]
        c = head.cfg
        self.d, self.hd, self.n_heads, self.n_kv = c.hidden, c.head_dim, c.n_heads, c.n_kv_heads
        self.eps = float(c.rms_eps)
        # float32 copies of the norms and the feature statistics: the C pieces read them by pointer
        self.vec = {name: _f32(t.detach()) for name, t in (
            ("emb", head.emb_norm.weight), ("feat", head.feat_norm.weight), ("post", head.post_norm.weight),
            ("norm", head.norm.weight), ("mu", head.feat_mu), ("sigma", head.feat_sigma))}

    @classmethod
    def build(cls, head) -> "HeadStep | None":
        modules = {"fc": head.fc, "o": head.o_proj, "down": head.down, "lm": head.lm, **head.fused}
        linears = {name: _packed(m) for name, m in modules.items() if m is not None}
        if len(linears) != 7 or any(w is None for w in linears.values()) \
                or len({w.label for w in linears.values()}) != 1:
            return None
        lib, _ = registry.load("head_step")
        return None if lib is None else cls(lib, head, linears)

    def _call(self, name: str, *args) -> None:
        if self.fns[name](*args, self.dot):
            raise MemoryError(f"{name}: no memory for the head's scratch rows")

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        """Target hidden states [n, layers * hidden] -> fused feature [n, hidden]."""
        x = _f32(feats)
        w = self.w["fc"]
        out = torch.empty(_rows(x, w.k, "features"), self.d, device="cpu")
        if out.shape[0] == 0:
            return out
        self._call("head_fuse", x.data_ptr(), x.shape[0], w.k, self.vec["mu"].data_ptr(),
                   self.vec["sigma"].data_ptr(), w.weight.data_ptr(), self.d, out.data_ptr())
        return out

    def project(self, which: str, feat: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Layer input from features [n, hidden] and tokens [n] through the fused "qkv" or "kv" linear, rotary
        embedding applied to q's and k's heads -> [n, heads, head_dim] (q, k, v or k, v heads in order)."""
        x, e = _f32(feat), _f32(self.head.embed[tokens])
        n = _rows(x, self.d, "features")
        cos, sin = self.head._rope_at(pos)
        cos, sin = _f32(cos.reshape(-1, self.hd)), _f32(sin.reshape(-1, self.hd))
        if _rows(e, self.d, "token embeddings") != n or cos.shape[0] != n or sin.shape[0] != n:
            raise ValueError(f"head step: {n} features for {e.shape[0]} tokens at {cos.shape[0]} positions")
        w = self.w[which]
        n_rope = self.n_kv + (self.n_heads if which == "qkv" else 0)
        y = torch.empty(n, w.n, device="cpu")
        if n == 0:
            return y.view(0, -1, self.hd)
        self._call("head_qkv", x.data_ptr(), e.data_ptr(), x.shape[0], self.d, self.vec["emb"].data_ptr(),
                   self.vec["feat"].data_ptr(), self.eps, w.weight.data_ptr(), w.n, n_rope, self.hd, cos.data_ptr(),
                   sin.data_ptr(), y.data_ptr())
        return y.view(x.shape[0], -1, self.hd)

    def finish(self, feat: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual stream after the attention output [n, heads * head_dim] and the MLP: the feature g."""
        f, a = _f32(feat), _f32(attn)
        gu = self.w["gate_up"]
        n = _rows(f, self.d, "features")
        if _rows(a, self.w["o"].k, "attention outputs") != n:
            raise ValueError(f"head step: {n} features for {a.shape[0]} attention rows")
        out = torch.empty(n, self.d, device="cpu")
        if n == 0:
            return out
        self._call("head_finish", f.data_ptr(), a.data_ptr(), f.shape[0], self.d, a.shape[1], gu.n // 2,
                   self.w["o"].weight.data_ptr(), self.vec["post"].data_ptr(), gu.weight.data_ptr(),
                   self.w["down"].weight.data_ptr(), self.eps, out.data_ptr())
        return out

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [n, draft_vocab]."""
        x = _f32(g)
        lm = self.w["lm"]
        out = torch.empty(_rows(x, self.d, "features"), lm.n, device="cpu")
        if out.shape[0] == 0:
            return out
        self._call("head_logits", x.data_ptr(), x.shape[0], self.d, self.vec["norm"].data_ptr(), self.eps,
                   lm.weight.data_ptr(), lm.n, out.data_ptr())
        return out
