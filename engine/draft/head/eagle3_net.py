"""A published EAGLE-3 head (Li et al., arXiv:2503.01840) as our draft head network.

EAGLE-3's step is the one net.DraftHead computes (references: SafeAILab/EAGLE eagle/model/cnets.py,
LlamaDecoderLayeremb and Model.forward; vllm-project/speculators src/speculators/models/eagle3/
model_definitions.py, Eagle3FirstLayerMixin.forward; vLLM vllm/model_executor/models/llama_eagle3.py):

    x  = fc(cat(h_low, h_mid, h_high))                  the target's raw hidden states, not standardised
    a  = attn(cat(input_layernorm(embed(token)), hidden_norm(x)))    q, k, v read 2 * hidden inputs; RoPE
    r  = x + o_proj(a)        (speculators' norm_before_residual: hidden_norm(x) + o_proj(a))
    g  = r + mlp(post_attention_layernorm(r))           fed back as x at the next draft depth
    logits = lm_head(norm(g)) over the draft vocabulary; draft id i is target id i + d2t[i]

So an EAGLE-3 head is a DraftHead whose feature statistics are the identity without the clamp, whose LM head is
its own trained matrix rather than the target's embedding rows, whose d2t holds target ids (offsets added at
load), and whose rotary embedding is the checkpoint's (any of transformers' RoPE types). Its linears keep the
checkpoint's values: no float16 storage and no C head step (which standardises and clamps the features).
"""

from __future__ import annotations

import torch

from engine.draft.head.net import DraftHead, HeadConfig, rotate
from engine.load.eagle3 import Eagle3Checkpoint


def rotary_frequencies(rope: dict, head_dim: int) -> tuple[torch.Tensor, float]:
    """inv_freq [head_dim / 2] and the attention scaling of the checkpoint's RoPE (transformers' definitions)."""
    theta = float(rope.get("rope_theta", 10000.0))
    kind = rope.get("rope_type", "default")
    if kind == "default":
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim)), 1.0
    if kind == "dynamic":  # its frequencies change with the sequence's length: not a fixed table
        raise ValueError("EAGLE-3 checkpoint: dynamic RoPE scaling is not supported")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if kind not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"EAGLE-3 checkpoint: RoPE type {kind!r} is not known to this transformers")
    params = {k: v for k, v in rope.items() if k not in ("type", "max_position_embeddings")}
    cfg = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim,
                      max_position_embeddings=rope["max_position_embeddings"], rope_scaling=params)
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
    return inv_freq.float(), float(scaling)


class Eagle3Head(DraftHead):
    def __init__(self, cfg: HeadConfig, ck: Eagle3Checkpoint):
        super().__init__(cfg)
        self.norm_before_residual = ck.norm_before_residual
        self.inv_freq, self.rope_scaling = rotary_frequencies(ck.rope, cfg.head_dim)
        self.lm_head = ck.tensors["lm_head.weight"]  # [draft_vocab, hidden] float32, the trained LM head
        self.own_embed = ck.embed  # the head's own token table where it carries one (else the target's)
        self.lin_request = "auto"  # the linears' arithmetic (engine/draft/lin_path.py), set by the drafter
        self.lin_path = None  # what for_inference chose
        offsets = ck.tensors.get("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.long, device="cpu"))
        state = {k: v for k, v in ck.tensors.items() if k not in ("lm_head.weight", "d2t")}
        state.update(feat_mu=torch.zeros(self.feat_mu.shape, device="cpu"),
                     feat_sigma=torch.ones(self.feat_sigma.shape, device="cpu"),
                     d2t=torch.arange(cfg.draft_vocab, device="cpu") + offsets.long())
        self.load_state_dict(state)

    def attach_target(self, embed_weight: torch.Tensor) -> None:
        # the checkpoint's own tables go where the target's embeddings are (the drafter moved the modules there)
        device = embed_weight.device
        self.embed = (self.own_embed if self.own_embed is not None else embed_weight).detach().to(device)
        self.lm_weight = self.lm_head = self.lm_head.to(device)
        self.inv_freq = self.inv_freq.to(device)

    def for_inference(self, dtype: torch.dtype, integer: bool = False) -> None:
        """The linears fused, with their own values (no float16 store: a published head's weights were not
        trained to be rounded so), in the arithmetic `lin_request` names (engine/draft/lin_path.py): "auto" times
        torch's, packed float32 and the target's own (bfloat16 in `dtype`, or Q8_0 groups times 8-bit inputs)
        here, and takes another than torch's only where it is faster."""
        from engine.draft.lin_path import resolve

        linears = self.fuse_linears(torch.float32)  # each path casts its rows; the head's pieces stay float32
        target = "int8" if integer else "bfloat16" if dtype == torch.bfloat16 else "float32"
        self.lin_path = resolve(self.lin_request, linears, target, (1, 4), "draft-eagle3")
        self.lm_weight = self.lm_head = None  # the LM head's linear is the one copy
        self.step = None

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        return self._lin(self.fc, feats.float())

    def finish(self, feat: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        return super().finish(self.feat_norm(feat) if self.norm_before_residual else feat, attn)

    def _rope_at(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = int(pos.max()) + 1 if pos.numel() else 0
        if n > self.rope_cos.shape[0] or self.rope_cos.device != pos.device:
            size = max(n, 2 * self.rope_cos.shape[0], 256)
            ang = torch.arange(size, dtype=torch.float32, device=pos.device)[:, None] * self.inv_freq.to(pos.device)
            ang = torch.cat([ang, ang], dim=-1).unsqueeze(-2)
            self.rope_cos, self.rope_sin = ang.cos() * self.rope_scaling, ang.sin() * self.rope_scaling
        return self.rope_cos[pos], self.rope_sin[pos]

    def qkv(self, feat: torch.Tensor, tokens: torch.Tensor, pos: torch.Tensor):
        if self.fused:
            return super().qkv(feat, tokens, pos)
        # unfused (before for_inference): the checkpoint's rotary table, not the default one DraftHead's uses
        x, c = self._layer_input(feat, tokens), self.cfg
        shape = x.shape[:-1]
        q = self._lin(self.q_proj, x).view(*shape, c.n_heads, c.head_dim)
        k = self._lin(self.k_proj, x).view(*shape, c.n_kv_heads, c.head_dim)
        v = self._lin(self.v_proj, x).view(*shape, c.n_kv_heads, c.head_dim)
        cos, sin = self._rope_at(pos)
        return rotate(q, cos, sin), rotate(k, cos, sin), v


def target_layers(ck: Eagle3Checkpoint, n_layers: int) -> tuple[int, ...]:
    """The target hidden states the head fuses: the checkpoint's, else EAGLE-3's low, middle and high layers."""
    return ck.layers if ck.layers is not None else (2, n_layers // 2, n_layers - 3)


def check_fits(ck: Eagle3Checkpoint, target) -> tuple[int, ...]:
    """Refuse a head made for another target (ValueError with the reason); returns the layers it reads."""
    emb = target.model.get_input_embeddings().weight
    n_layers = int(getattr(target.model.config, "num_hidden_layers", 0))
    if emb.shape[1] != ck.hidden:
        raise ValueError(f"draft-eagle3: the head's hidden size is {ck.hidden}, the target's is {emb.shape[1]}: "
                         "it was made for another model")
    if emb.shape[0] != ck.target_vocab:
        raise ValueError(f"draft-eagle3: the head's target vocabulary has {ck.target_vocab} tokens, the target's "
                         f"{emb.shape[0]}: it was made for another model")
    layers = target_layers(ck, n_layers)
    if list(layers) != sorted(set(layers)) or min(layers) < 0 or max(layers) > n_layers:
        raise ValueError(f"draft-eagle3: the head reads hidden layers {list(layers)}; the target has {n_layers} "
                         "layers (distinct, ascending indices in 0..layers are needed)")
    if ck.tensors["fc.weight"].shape[1] != len(layers) * ck.hidden:
        raise ValueError(f"draft-eagle3: fc takes {ck.tensors['fc.weight'].shape[1]} inputs, not "
                         f"{len(layers)} hidden states of {ck.hidden}")
    if tuple(ck.tensors["lm_head.weight"].shape) != (ck.draft_vocab, ck.hidden):
        raise ValueError(f"draft-eagle3: lm_head is {tuple(ck.tensors['lm_head.weight'].shape)}, the config "
                         f"gives ({ck.draft_vocab}, {ck.hidden})")
    d2t = ck.tensors.get("d2t")
    if d2t is not None and (d2t.shape != (ck.draft_vocab,)
                            or int((torch.arange(ck.draft_vocab, device="cpu") + d2t.cpu()).max()) >= emb.shape[0]):
        raise ValueError("draft-eagle3: d2t does not map the draft vocabulary into the target's")
    if ck.embed is not None and tuple(ck.embed.shape) != tuple(emb.shape):
        raise ValueError(f"draft-eagle3: the head's embedding table is {tuple(ck.embed.shape)}, the target's "
                         f"{tuple(emb.shape)}")
    return layers


def eagle3_head(ck: Eagle3Checkpoint, target) -> Eagle3Head:
    """The head for `target`, checked to fit it, target parts not yet attached."""
    layers = check_fits(ck, target)
    cfg = HeadConfig(hidden=ck.hidden, n_heads=ck.n_heads, n_kv_heads=ck.n_kv_heads, head_dim=ck.head_dim,
                     intermediate=ck.intermediate, layers=layers, draft_vocab=ck.draft_vocab,
                     target_vocab=ck.target_vocab, rope_theta=float(ck.rope.get("rope_theta", 10000.0)),
                     rms_eps=ck.rms_eps, extra={"layout": ck.layout})
    try:
        with torch.device("cpu"):  # built where the checkpoint was read; the drafter moves it beside the target
            head = Eagle3Head(cfg, ck)
    except RuntimeError as e:  # a tensor whose shape the config does not give
        raise ValueError(f"draft-eagle3: the weights do not match the config: {e}") from None
    return head.eval()

