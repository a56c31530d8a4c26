"""Tiny DFlash and DSpark drafts over a tiny Qwen3 target: random weights under the authors' names, briefly fit
to the target's greedy text, written as the authors' directory (config.json + model.safetensors) and as the GGUF
llama.cpp's convert_hf_to_gguf.py writes; and an independent forward of the published equations
(z-lab/dflash dflash/model.py), in plain torch over a whole context recomputed from scratch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from tiny import WORDS, make_tokenizer

N_TARGET_LAYERS, LAYER_IDS = 5, [1, 3]  # the target's depth; the layers whose outputs the draft reads
H, HEADS, KV, HD, INTER, N_LAYERS, EPS, THETA = 64, 4, 2, 16, 96, 2, 1e-6, 10000.0
BLOCK, MASK, RANK, DRAFT_VOCAB = 5, 63, 8, 48


def make_target(seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=64, hidden_size=H, intermediate_size=128, num_hidden_layers=N_TARGET_LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, max_position_embeddings=1024,
                      rms_norm_eps=EPS, rope_theta=THETA, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                      tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharper logits: greedy text with structure, few near-ties
    return model


def draft_weights(seed: int, dspark: bool) -> dict[str, torch.Tensor]:
    """Random weights under the authors' names (dflash/model.py DFlashDraftModel; DSpark's heads as llama.cpp's
    converter reads them), norms near one."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale / math.sqrt(shape[-1])

    def norm(n):
        return 1 + 0.1 * torch.randn(n, generator=g)

    out = {"fc.weight": w(H, H * len(LAYER_IDS)), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for i in range(N_LAYERS):
        p = f"layers.{i}."
        out.update({p + "self_attn.q_proj.weight": w(HEADS * HD, H, scale=2.0),
                    p + "self_attn.k_proj.weight": w(KV * HD, H, scale=2.0),
                    p + "self_attn.v_proj.weight": w(KV * HD, H),
                    p + "self_attn.o_proj.weight": w(H, HEADS * HD), p + "self_attn.q_norm.weight": norm(HD),
                    p + "self_attn.k_norm.weight": norm(HD), p + "input_layernorm.weight": norm(H),
                    p + "post_attention_layernorm.weight": norm(H), p + "mlp.gate_proj.weight": w(INTER, H),
                    p + "mlp.up_proj.weight": w(INTER, H), p + "mlp.down_proj.weight": w(H, INTER)})
    if dspark:  # a reduced draft vocabulary with its own head, the Markov head and the confidence head
        used = torch.randperm(64, generator=g)[:DRAFT_VOCAB].sort().values
        out.update({"lm_head.weight": w(DRAFT_VOCAB, H, scale=6.0), "d2t": used - torch.arange(DRAFT_VOCAB),
                    "markov_head.markov_w1.weight": w(64, RANK, scale=4.0),
                    "markov_head.markov_w2.weight": w(DRAFT_VOCAB, RANK, scale=4.0),
                    "confidence_head.proj.weight": w(1, H + RANK), "confidence_head.proj.bias": torch.zeros(1)})
    return out


# ---- the published equations, from scratch ------------------------------------------------------------------

def rms(x, weight):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def rope(x, pos):
    """x [heads, T, HD] rotated at pos [T]: rotate_half, as transformers' Qwen3 applies it."""
    freq = pos.float()[:, None] / THETA ** (torch.arange(0, HD, 2).float() / HD)[None]
    cos, sin = torch.cos(torch.cat([freq, freq], -1)), torch.sin(torch.cat([freq, freq], -1))
    rotated = torch.cat([-x[..., HD // 2:], x[..., : HD // 2]], -1)
    return x * cos + rotated * sin


def block_hidden(w: dict, target, feats: torch.Tensor, blocks: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """DFlashDraftModel.forward: the normed hidden states [A * B, H] of blocks [A, B] of token ids, block a at
    positions starts[a] .. starts[a] + B - 1 after the context feats[:starts[a]] (target features [n, 2 * H]):
    context keys and values from hidden_norm(fc(feats)), each block attending to all of its context and all of
    itself (several blocks side by side only to fit them in fewer steps)."""
    n, (a, b) = feats.shape[0], blocks.shape
    ctx = rms(feats @ w["fc.weight"].T, w["hidden_norm.weight"])
    x = target.model.embed_tokens.weight[blocks.flatten()].float()
    q_pos = (starts[:, None] + torch.arange(b)).flatten()
    k_pos = torch.cat([torch.arange(n), q_pos])
    which = torch.arange(a).repeat_interleave(b)
    visible = torch.cat([torch.arange(n)[None] < starts[which][:, None], which[:, None] == which[None]], 1)
    for i in range(N_LAYERS):
        p = f"layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rms((h @ w[p + "self_attn.q_proj.weight"].T).view(a * b, HEADS, HD), w[p + "self_attn.q_norm.weight"])
        both = torch.cat([ctx, h])
        k = rms((both @ w[p + "self_attn.k_proj.weight"].T).view(-1, KV, HD), w[p + "self_attn.k_norm.weight"])
        v = (both @ w[p + "self_attn.v_proj.weight"].T).view(-1, KV, HD)
        q, k = rope(q.transpose(0, 1), q_pos), rope(k.transpose(0, 1), k_pos)
        k, v = k.repeat_interleave(HEADS // KV, 0), v.transpose(0, 1).repeat_interleave(HEADS // KV, 0)
        scores = (q @ k.transpose(1, 2) / math.sqrt(HD)).masked_fill(~visible, float("-inf"))
        att = torch.softmax(scores, -1) @ v
        x = x + att.transpose(0, 1).reshape(a * b, HEADS * HD) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        x = x + (F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) @ \
            w[p + "mlp.down_proj.weight"].T
    return rms(x, w["norm.weight"])


def block_logits(w: dict, target, h: torch.Tensor) -> torch.Tensor:
    """[B, 64] logits: the target's LM head, or the draft's own over its reduced vocabulary (-inf elsewhere)."""
    if "lm_head.weight" not in w:
        return h @ target.lm_head.weight.T
    out = torch.full((h.shape[0], 64), float("-inf"))
    out[:, w["d2t"] + torch.arange(DRAFT_VOCAB)] = h @ w["lm_head.weight"].T
    return out


def markov_bias(w: dict, prev: int) -> torch.Tensor:
    bias = torch.zeros(64)
    low_rank = w["markov_head.markov_w2.weight"] @ w["markov_head.markov_w1.weight"][prev]
    bias[w["d2t"] + torch.arange(DRAFT_VOCAB)] = low_rank
    return bias


def features(target, ids: list[int]) -> torch.Tensor:
    """transformers' hidden_states[id + 1] of the target at every position of `ids`, side by side."""
    with torch.no_grad():
        hs = target(torch.tensor([ids]), output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1][0] for i in LAYER_IDS], -1).float()


# ---- fitting, briefly -----------------------------------------------------------------------------------------

def fit(w: dict, target, prompts: list[list[int]], steps: int, dspark: bool, n_new: int = 28) -> None:
    """A few steps of teacher forcing on the target's greedy continuations of `prompts` (each block's rows
    predicting the tokens after its anchor), so that the drafts are often kept."""
    with torch.no_grad():
        texts = [target.generate(torch.tensor([p]), max_new_tokens=n_new, do_sample=False, eos_token_id=None,
                                 pad_token_id=3)[0].tolist() for p in prompts]
    feats = [features(target, t) for t in texts]
    train = [k for k in w if k != "d2t"]
    for k in train:
        w[k].requires_grad_(True)
    opt = torch.optim.AdamW([w[k] for k in train], lr=1e-2)
    first = 0 if dspark else 1
    for _ in range(steps):
        loss = 0.0
        for text, feat in zip(texts, feats):
            starts = torch.arange(len(text) - n_new, len(text) - BLOCK, 2)
            blocks = torch.tensor([[text[a]] + [MASK] * (BLOCK - 1) for a in starts.tolist()])
            logits = block_logits(w, target, block_hidden(w, target, feat, blocks, starts)).view(len(starts), BLOCK, 64)
            if dspark:
                logits = logits + torch.stack([torch.stack([markov_bias(w, t) for t in text[a: a + BLOCK]])
                                               for a in starts.tolist()])
            want = torch.tensor([text[a + 1: a + 1 + BLOCK - first] for a in starts.tolist()])
            loss = loss + F.cross_entropy(logits[:, first:].flatten(0, 1), want.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    for k in train:
        w[k] = w[k].detach()


# ---- the two layouts --------------------------------------------------------------------------------------------

def write_hf(path: Path, w: dict, dspark: bool) -> Path:
    """The authors' directory: DFlash's names bare (dflash/model.py), DSpark's under `model.` with the top-level
    target_layer_ids and mask_token_id its exports use."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    cfg = {"architectures": ["DSparkDraftModel" if dspark else "DFlashDraftModel"], "model_type": "qwen3",
           "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HD,
           "intermediate_size": INTER, "num_hidden_layers": N_LAYERS, "rms_norm_eps": EPS, "rope_theta": THETA,
           "vocab_size": 64, "hidden_act": "silu", "block_size": BLOCK, "num_target_layers": N_TARGET_LAYERS}
    if dspark:
        cfg.update(target_layer_ids=LAYER_IDS, mask_token_id=MASK, draft_vocab_size=DRAFT_VOCAB,
                   markov_head_type="vanilla")
    else:
        cfg["dflash_config"] = {"mask_token_id": MASK, "target_layer_ids": LAYER_IDS}
    (path / "config.json").write_text(json.dumps(cfg))
    names = {(k if k in ("d2t", "lm_head.weight") or not dspark else "model." + k): v.contiguous()
             for k, v in w.items()}
    save_file(names, str(path / "model.safetensors"))
    return path


GGUF_NAMES = {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight",
              "norm.weight": "output_norm.weight", "lm_head.weight": "output.weight",
              "markov_head.markov_w1.weight": "markov_w1.weight", "markov_head.markov_w2.weight": "markov_w2.weight",
              "confidence_head.proj.weight": "conf_proj.weight", "confidence_head.proj.bias": "conf_proj.bias"}
GGUF_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
              "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def write_gguf(path: Path, w: dict, dspark: bool, q8: bool = False) -> Path:
    """What convert_hf_to_gguf.py writes for it (conversion/qwen.py DFlashModel, DSparkModel): architecture
    dflash, the layer ids + 1, d2t as absolute ids, float16 matrices as its default output type keeps them
    (q8: Q8_0 blocks, as `--outtype q8_0` writes them)."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    out = GGUFWriter(str(path), "dflash")
    for key, value in (("block_count", N_LAYERS), ("embedding_length", H), ("feed_forward_length", INTER),
                       ("attention.head_count", HEADS), ("attention.head_count_kv", KV), ("attention.key_length", HD),
                       ("attention.value_length", HD), ("context_length", 1024), ("block_size", BLOCK)):
        out.add_uint32(f"dflash.{key}", value)
    out.add_float32("dflash.attention.layer_norm_rms_epsilon", EPS)
    out.add_float32("dflash.rope.freq_base", THETA)
    out.add_array("dflash.target_layers", [i + 1 for i in LAYER_IDS])
    out.add_uint32("tokenizer.ggml.mask_token_id", MASK)
    if dspark:
        out.add_bool("dflash.sample_from_anchor", True)
        out.add_bool("dflash.has_confidence_head", True)
    for key, t in w.items():
        if key == "d2t":
            out.add_tensor("d2t", (t + torch.arange(DRAFT_VOCAB)).numpy().astype(np.int64))
            continue
        if key.startswith("layers."):
            _, i, rest = key.split(".", 2)
            name = f"blk.{i}.{GGUF_LAYER[rest.rsplit('.', 1)[0]]}.weight"
        else:
            name = GGUF_NAMES[key]
        arr = t.numpy()
        if q8 and arr.ndim == 2 and arr.shape[-1] % 32 == 0:  # rows of whole blocks, as llama.cpp quantises
            blocks = quantize(arr.astype(np.float32), GGMLQuantizationType.Q8_0)
            out.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            out.add_tensor(name, arr.astype(np.float16) if arr.ndim == 2 else arr.astype(np.float32))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return path


def as_stored_in_gguf(w: dict) -> dict:
    """The weights as the GGUF holds them (matrices through float16): what its drafts must equal."""
    return {k: (v.half().float() if v.ndim == 2 and v.is_floating_point() else v) for k, v in w.items()}


def save_tiny_target(path: Path, seed: int = 0):
    """The tiny target saved to `path`; returns (path, the model as transformers holds it)."""
    model = make_target(seed)
    model.save_pretrained(path)
    make_tokenizer(WORDS).save_pretrained(path)
    return path, model


FIT_PROMPTS = [[1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 10, 11, 12, 13, 14, 15, 16, 17], [1, 40, 41, 40, 41, 42]]


def main(out: str) -> None:
    """`python tests/tiny_dflash.py OUT`: the tiny target (OUT/target) and both drafts, fitted as the tests fit
    them, in both layouts (OUT/dflash, OUT/dflash.gguf, OUT/dspark, OUT/dspark.gguf), to measure with the bench."""
    root = Path(out)
    _, target = save_tiny_target(root / "target")
    torch.set_num_threads(1)
    for dspark in (False, True):
        w = draft_weights(1 + dspark, dspark)
        fit(w, target, FIT_PROMPTS, steps=40, dspark=dspark)
        w = as_stored_in_gguf(w)
        name = "dspark" if dspark else "dflash"
        write_hf(root / name, w, dspark)
        write_gguf(root / f"{name}.gguf", w, dspark)


if __name__ == "__main__":
    import sys

    main(sys.argv[1])
