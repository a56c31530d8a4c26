"""The draft head network: the shape of EAGLE-3 (Li et al., arXiv:2503.01840) at the scale of a 135M target.
Trained offline by the `training` package (python -m training.train); loaded here by the draft-head drafter.

Input at position t: the target's hidden states h(t-1) of a low, a middle and a high layer, standardised per
dimension (a few dimensions of a small LM's residual stream reach 10^4, which a linear layer cannot take raw)
and fused by one linear layer to the target width, plus the target's own (frozen) embedding of token t. One
Llama-style decoder layer (attention over the head's own KV cache, then a gated MLP) turns them into a feature
g(t); the final norm and a reduced LM head give the next-token distribution over the `draft_vocab` most frequent
target tokens. The LM head's rows are the target's tied embedding rows of those tokens (frozen), so only
`d2t`, the map back to target ids, is stored. Deeper draft positions feed g(t) back in place of the fused
target feature: the head predicts autoregressively from its own features.

Only the trained parameters are saved; `attach_target` fills the frozen parts from the target at load time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class HeadConfig:
    hidden: int = 576  # target hidden size (the head works at the same width)
    n_heads: int = 9  # attention heads of the decoder layer
    n_kv_heads: int = 3  # key/value heads (grouped-query attention, as the target)
    head_dim: int = 64  # per-head width
    intermediate: int = 1024  # gated MLP width (the target's layers use 1536)
    layers: tuple[int, ...] = (2, 15, 27)  # target hidden_states indices read: low, middle, high
    draft_vocab: int = 8192  # most frequent target tokens the head can propose
    target_vocab: int = 49152  # target vocabulary size
    rope_theta: float = 100000.0  # the target's rotary base
    rms_eps: float = 1e-5  # norm epsilon
    target_fingerprint: str = ""  # hash of the target embedding table the head was trained for
    # the same hash of that table rounded to bfloat16: matches the model loaded in float32 or in bfloat16
    target_fingerprint_bf16: str = ""
    extra: dict = field(default_factory=dict)  # training facts recorded with the weights (not used to run)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "HeadConfig":
        d = json.loads(text)
        d["layers"] = tuple(d["layers"])
        return cls(**d)


def _fingerprint_sample(embed_weight: torch.Tensor) -> torch.Tensor:
    """The rows and columns the fingerprints hash, as they are (taken before any conversion: no full copy)."""
    w = embed_weight.detach()
    return w[:: max(1, w.shape[0] // 512), :64].cpu()


def _hash(sample: torch.Tensor, shape) -> str:
    return (hashlib.sha256(sample.float().contiguous().numpy().round(4).tobytes()).hexdigest()[:16]
            + f"-{shape[0]}x{shape[1]}")


def target_fingerprint(embed_weight: torch.Tensor) -> str:
    """A short hash of the target's embedding table: tells the model the head was trained for from any other.
    Exact values: the same model loaded in float32 and in bfloat16 hashes differently (also the key of the
    training data cache, whose features differ with the dtype)."""
    return _hash(_fingerprint_sample(embed_weight), embed_weight.shape)


def bf16_fingerprint(embed_weight: torch.Tensor) -> str:
    """target_fingerprint of the table rounded to bfloat16: the same for a float32 table and its bfloat16 copy
    (a bfloat16 load of the model is its float32 weights rounded to nearest), so a head trained on either
    dtype is recognised on both."""
    return _hash(_fingerprint_sample(embed_weight).to(torch.bfloat16), embed_weight.shape)


def fingerprint_matches(cfg: HeadConfig, embed_weight: torch.Tensor) -> bool:
    """Whether the target's embedding table is the one the head was trained for (no fingerprint: yes): the exact
    hash, or the bfloat16-rounded one (the same model in the other dtype)."""
    if not cfg.target_fingerprint or target_fingerprint(embed_weight) == cfg.target_fingerprint:
        return True
    want = cfg.target_fingerprint_bf16
    return bool(want) and bf16_fingerprint(embed_weight) == want


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_angles(pos: torch.Tensor, d: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [..., n, 1, d] of the rotary angles at positions pos [..., n] (the target's 'default' RoPE)."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=pos.device) / d))
    ang = pos.float()[..., None] * inv  # [..., n, d/2]
    cos = torch.cat([ang.cos(), ang.cos()], dim=-1).unsqueeze(-2)
    sin = torch.cat([ang.sin(), ang.sin()], dim=-1).unsqueeze(-2)
    return cos, sin


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [..., n, heads, head_dim] at positions pos [..., n]."""
    return rotate(x, *rope_angles(pos, x.shape[-1], theta))


class DraftHead(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        h, n_in = cfg.hidden, cfg.hidden * len(cfg.layers)
        self.register_buffer("feat_mu", torch.zeros(n_in))  # per-dimension feature mean (from training data)
        self.register_buffer("feat_sigma", torch.ones(n_in))  # per-dimension feature spread
        self.register_buffer("d2t", torch.arange(cfg.draft_vocab))  # draft id -> target id
        self.fc = nn.Linear(n_in, h, bias=False)
        self.emb_norm = RMSNorm(h, cfg.rms_eps)
        self.feat_norm = RMSNorm(h, cfg.rms_eps)
        self.q_proj = nn.Linear(2 * h, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, h, bias=False)
        self.post_norm = RMSNorm(h, cfg.rms_eps)
        self.gate = nn.Linear(h, cfg.intermediate, bias=False)
        self.up = nn.Linear(h, cfg.intermediate, bias=False)
        self.down = nn.Linear(cfg.intermediate, h, bias=False)
        self.norm = RMSNorm(h, cfg.rms_eps)
        # frozen, filled from the target by attach_target; never saved
        self.embed: torch.Tensor | None = None  # [target_vocab, hidden], the target's own table, in its dtype
        self.lm_weight: torch.Tensor | None = None  # [draft_vocab, hidden], float32
        self.lm: nn.Linear | None = None  # the same as a packed linear, once for_inference made it
        self.lin_dtype = torch.float32  # what the linears compute in (for_inference)
        # for_inference's fused linears, kept out of the trained state: "qkv" (q_proj, k_proj, v_proj as one
        # weight), "kv" (k_proj, v_proj: the catch-up's rows, which need no query) and "gate_up" (gate, up);
        # empty: the trained modules one by one (training)
        self.fused: dict[str, nn.Linear] = {}
        self.rope_cos = torch.zeros(0, 1, cfg.head_dim)  # for_inference: cos and sin by position, grown on demand
        self.step = None  # for_inference: the dense pieces in C where the linears are our float16 kernel
        self.rope_sin = torch.zeros(0, 1, cfg.head_dim)

    def attach_target(self, embed_weight: torch.Tensor) -> None:
        """Borrow the target's embedding table (input embeddings, and the tied LM head rows of d2t).

        The table is kept as it is, in the target's dtype (no float32 copy of a bfloat16 table: 49152 x 576 x 4
        bytes); only the draft vocabulary's rows of the LM head are made float32 here, and `qkv` converts the
        rows it looks up."""
        self.embed = embed_weight.detach()
        self.lm_weight = self.embed[self.d2t].float().contiguous()

    def for_inference(self, dtype: torch.dtype, integer: bool = False) -> None:
        """Run the head's linears in `dtype` (the target's) through packed weights, as the target runs its own
        (engine/forward/prepack.py): a head step reads all its weights for one or a few rows, so it costs what they
        weigh, and bfloat16 halves it. Beside a float32 target the weights are kept in float16 where the CPU has
        our float16-weight kernel (engine/forward/gemm.py): the trained ones are stored in float16 (save_head), so that
        rounds nothing of them, and the LM head's rows (the target's embeddings) lose bits a draft can spare,
        for half the bytes (the target's forward evicts them from the cache between rounds). Norms, residuals
        and attention stay float32. integer: beside a target whose linears multiply 8-bit inputs in integers
        (engine/forward/quant.py), the head's weights become Q8_0 groups on the same kernel (half float16's bytes; its
        drafts change a little, what the target accepts of them does not depend on it)."""
        from engine.forward import prepack

        linears = self.fuse_linears(dtype)
        if dtype == torch.float32 and integer:
            from engine.forward.quant_dot import pack_linear_q8_0

            for module in linears:  # where the kernel does not run, prepacking below takes them
                pack_linear_q8_0(module)
        if prepack.available():
            for module in linears:
                prepack.prepack_linears(module, store=torch.float16 if dtype == torch.float32 else None)
        self.lm_weight = None  # the packed LM head is the one copy
        from engine.draft.head.step import HeadStep

        self.step = HeadStep.build(self)

    def fuse_linears(self, dtype: torch.dtype) -> list[nn.Linear]:
        """The LM head as a linear and the fused linears, all in `dtype`; returns every linear the head runs."""
        self.lm = _frozen_linear(self.lm_weight)
        # linears that read the same input become one: a head step is a few rows, so each call costs its
        # overhead and its trip to memory, and fewer calls are what makes a step cheap. In our kernel each output
        # is still its own sum over the inputs in order, so the fused layer gives the bits the separate ones give
        self.fused = {"qkv": _stacked([self.q_proj, self.k_proj, self.v_proj]),
                      "kv": _stacked([self.k_proj, self.v_proj]), "gate_up": _stacked([self.gate, self.up])}
        for name in ("q_proj", "k_proj", "v_proj", "gate", "up"):
            delattr(self, name)  # the fused copy is the one the head runs
        linears = [m for m in self.modules() if isinstance(m, nn.Linear)] + list(self.fused.values())
        for module in linears:
            module.to(dtype)
        self.lin_dtype = dtype
        return linears

    def _lin(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return module(x.to(self.lin_dtype)).float()

    def trained_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().contiguous() for k, v in self.state_dict().items()}

    # ---- pieces, shared by the drafter (one row per step) and training (whole sequences) ----------------

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        """Target hidden states [..., layers*hidden] -> fused feature [..., hidden]."""
        if self.step is not None and feats.dim() == 2:
            return self.step.fuse(feats)
        z = ((feats.float() - self.feat_mu) / self.feat_sigma).clamp(-10.0, 10.0)
        return self._lin(self.fc, z)

    def _layer_input(self, feat: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        e = self.embed[tokens].float()
        return torch.cat([self.emb_norm(e), self.feat_norm(feat)], dim=-1)

    def kv_then_q(self, feat: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor, q_rows: torch.Tensor):
        """k, v for every row [n, kv_heads, d] and q for q_rows only [len(q_rows), heads, d], RoPE applied:
        catching up on a prompt makes every position's KV entry, but a query only where drafting starts, and q
        is 60% of the three projections. In our kernel each output is its own sum, so k and v carry the bits
        that `qkv` gives them. Below 12 rows without a query the second call costs more than it saves, and
        the saving grows with the rows (docs/history.md#the-heads-own-costs)."""
        if "kv" not in self.fused or feat.shape[0] - len(q_rows) < 12:
            q, k, v = self.qkv(feat, tokens, pos)
            return q[q_rows], k, v
        k, v = self.kv(feat, tokens, pos)
        return self.qkv(feat[q_rows], tokens[q_rows], pos[q_rows])[0], k, v

    def kv(self, feat: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor):
        """k, v [n, kv_heads, d] (RoPE on k) for rows that need no query: the bits `qkv` gives them."""
        if "kv" in self.fused and self.step is not None:
            return self.step.project("kv", feat, tokens, pos).split([self.cfg.n_kv_heads] * 2, dim=-2)
        if "kv" in self.fused:
            x, c = self._layer_input(feat, tokens), self.cfg
            kv = self._lin(self.fused["kv"], x).view(x.shape[0], 2 * c.n_kv_heads, c.head_dim)
            k, v = kv.split([c.n_kv_heads, c.n_kv_heads], dim=-2)
            cos, sin = self._rope_at(pos)
            return rotate(k, cos, sin), v
        _, k, v = self.qkv(feat, tokens, pos)
        return k, v

    def qkv(self, feat: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor):
        """Layer input from a feature and a token embedding; returns (q, k, v) with RoPE applied."""
        if self.step is not None and feat.dim() == 2:
            c = self.cfg
            return self.step.project("qkv", feat, tokens, pos).split([c.n_heads, c.n_kv_heads, c.n_kv_heads], dim=-2)
        x = self._layer_input(feat, tokens)
        shape, c = x.shape[:-1], self.cfg
        if self.fused:
            qkv = self._lin(self.fused["qkv"], x).view(*shape, c.n_heads + 2 * c.n_kv_heads, c.head_dim)
            q, k, v = qkv.split([c.n_heads, c.n_kv_heads, c.n_kv_heads], dim=-2)
            cos, sin = self._rope_at(pos)
            return rotate(q, cos, sin), rotate(k, cos, sin), v
        q = self._lin(self.q_proj, x).view(*shape, c.n_heads, c.head_dim)
        k = self._lin(self.k_proj, x).view(*shape, c.n_kv_heads, c.head_dim)
        v = self._lin(self.v_proj, x).view(*shape, c.n_kv_heads, c.head_dim)
        return rope(q, pos, c.rope_theta), rope(k, pos, c.rope_theta), v

    def _rope_at(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., n, 1, d] at pos, from tables that grow by doubling (the same values rope computes)."""
        n = int(pos.max()) + 1 if pos.numel() else 0
        if n > self.rope_cos.shape[0] or self.rope_cos.device != pos.device:
            size = max(n, 2 * self.rope_cos.shape[0], 256)
            self.rope_cos, self.rope_sin = rope_angles(torch.arange(size, device=pos.device), self.cfg.head_dim,
                                                       self.cfg.rope_theta)
        return self.rope_cos[pos], self.rope_sin[pos]

    def finish(self, feat: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual stream after attention output [..., heads*head_dim] and the MLP: the head's feature g."""
        if self.step is not None and feat.dim() == 2:
            return self.step.finish(feat, attn)
        h = feat + self._lin(self.o_proj, attn)
        y = self.post_norm(h)
        if self.fused:
            gate, up = self._lin(self.fused["gate_up"], y).split(self.cfg.intermediate, dim=-1)
            return h + self._lin(self.down, F.silu(gate) * up)
        return h + self._lin(self.down, F.silu(self._lin(self.gate, y)) * self._lin(self.up, y))

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., draft_vocab] from features g."""
        if self.step is not None and g.dim() == 2:
            return self.step.logits(g)
        if self.lm is not None:
            return self._lin(self.lm, self.norm(g))
        return self.norm(g) @ self.lm_weight.T

    def expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        """[..., n, kv_heads, d] -> [..., n, heads, d] for grouped-query attention."""
        return t.repeat_interleave(self.cfg.n_heads // self.cfg.n_kv_heads, dim=-2)


def _frozen_linear(weight: torch.Tensor) -> nn.Linear:
    """A bias-free linear over `weight` [out, in], as it is (no copy), not trained."""
    out = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    out.weight = nn.Parameter(weight, requires_grad=False)
    return out


def _stacked(parts: list[nn.Linear]) -> nn.Linear:
    """One linear whose outputs are those of `parts` in order (same input, no bias)."""
    return _frozen_linear(torch.cat([p.weight.detach() for p in parts]))


def save_head(head: DraftHead, path: Path) -> None:
    """Weights in `path` (safetensors, float16 for the big matrices) and the config beside it (.json)."""
    from safetensors.torch import save_file

    state = {k: (v.half() if v.dim() == 2 else v) for k, v in head.trained_state().items()}
    save_file(state, str(path))
    path.with_suffix(".json").write_text(head.cfg.to_json())


def load_head(path: Path) -> DraftHead:
    """A head from save_head's files, in float32 on the CPU, target parts not yet attached."""
    from safetensors.torch import load_file

    cfg = HeadConfig.from_json(path.with_suffix(".json").read_text())
    with torch.device("cpu"):  # built where the file is read; the drafter moves it beside the target
        head = DraftHead(cfg)
    state = {k: (v.float() if v.is_floating_point() else v) for k, v in load_file(str(path)).items()}
    head.load_state_dict(state)
    return head.eval()
