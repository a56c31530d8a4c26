"""Tiny targets with multi-token-prediction layers: a GLM-4 MoE model from transformers' config class, its MTP
layers written after the decoder in the published layout (model.layers.{n_layers + k}.*, one tensor per expert,
the shared tables stored again per layer), beside transformers' own MtpModel holding the same weights."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from tiny import WORDS, make_tokenizer

N_LAYERS = 2


def make_glm(seed: int, n_mtp: int, vocab_size: int = 64):
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Glm4MoeConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                        num_hidden_layers=N_LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                        num_mtp_layers=n_mtp, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                        pad_token_id=3, tie_word_embeddings=False)
    model = Glm4MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharper logits: greedy text with structure, few near-ties
    return model


def make_mtp(model, n_mtp: int, seed: int):
    """transformers' MTP layers for `model`, random weights (norms near one, the projection scaled so the hidden
    state counts as much as the embedding)."""
    from transformers.modeling_layers import MtpModel

    torch.manual_seed(seed + 100)
    net = MtpModel(model, n_mtp).eval()
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.startswith("layers.") and name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "e_score_correction_bias" in name:
                p.zero_()
            elif ".experts." in name:  # left uninitialised by transformers' init of MtpModel
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return net


def train_mtp(model, net, prompts: list[list[int]], steps: int, n_new: int = 28) -> None:
    """Fit the MTP layers briefly to the model's greedy continuations of `prompts` (teacher forcing, layer k
    predicting the token k + 2 ahead of its hidden state, as DeepSeek-V3 trains them), so that their drafts are
    often kept; the model itself stays as it was."""
    from torch.nn.functional import cross_entropy

    with torch.no_grad():
        texts = [model.generate(torch.tensor([p]), max_new_tokens=n_new, do_sample=False, eos_token_id=None,
                                pad_token_id=3)[0, -(n_new + 6):] for p in prompts]
        seqs = torch.stack(texts)
        hs = model(seqs, output_hidden_states=True).hidden_states[-1]
    for p in model.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW(net.layers.parameters(), lr=1e-2)
    n = seqs.shape[1]
    for _ in range(steps):
        h, ids, pos, loss = hs[:, :-1], seqs[:, 1:], torch.arange(1, n)[None], 0.0
        for k in range(net.num_mtp_layers):
            h = net.forward_layer(k, h, pos, None, input_ids=ids)
            logits = net.shared_head(h[:, :-1])  # row j (position j + k + 1) predicts position j + k + 2
            loss = loss + cross_entropy(logits.flatten(0, 1), seqs[:, k + 2:].flatten())
            h, ids, pos = h[:, :-1], ids[:, 1:], pos[:, 1:]
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()


def published(net, n_layers: int) -> dict[str, torch.Tensor]:
    """MtpModel's weights under the checkpoint's names, one tensor per expert, tables stored per layer."""
    own = {"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "eh_proj.weight",
           "post_norm.weight": "shared_head.norm.weight"}
    out = {}
    for key, t in net.state_dict().items():
        m = re.match(r"layers\.(\d+)\.(.*)$", key)
        if m is None:
            continue
        prefix, rest = f"model.layers.{n_layers + int(m.group(1))}.", m.group(2)
        if rest in own:
            out[prefix + own[rest]] = t
        elif rest.endswith("experts.gate_up_proj"):
            base = rest[len("mtp_block."):-len(".gate_up_proj")]
            for e, w in enumerate(t):
                gate, up = w.chunk(2, dim=0)
                out[f"{prefix}{base}.{e}.gate_proj.weight"] = gate
                out[f"{prefix}{base}.{e}.up_proj.weight"] = up
        elif rest.endswith("experts.down_proj"):
            base = rest[len("mtp_block."):-len(".down_proj")]
            for e, w in enumerate(t):
                out[f"{prefix}{base}.{e}.down_proj.weight"] = w
        else:
            out[prefix + rest[len("mtp_block."):]] = t
    for k in range(net.num_mtp_layers):
        out[f"model.layers.{n_layers + k}.embed_tokens.weight"] = net.embed_tokens.weight
        out[f"model.layers.{n_layers + k}.shared_head.head.weight"] = net.shared_head.weight
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def save_tiny_mtp(path: Path, seed: int, n_mtp: int, prompts: list[list[int]] | None = None, train_steps: int = 0):
    """A tiny GLM-4 MoE target with n_mtp MTP layers saved to `path`; returns (path, the reference MtpModel)."""
    from safetensors.torch import load_file, save_file

    model = make_glm(seed, n_mtp)
    net = make_mtp(model, n_mtp, seed)
    if train_steps:
        train_mtp(model, net, prompts, train_steps)
    model.save_pretrained(path)
    make_tokenizer(WORDS).save_pretrained(path)
    f = path / "model.safetensors"
    save_file({**load_file(str(f)), **published(net, N_LAYERS)}, str(f), metadata={"format": "pt"})
    return path, net


def fewer_layers(src: Path, dst: Path, n_mtp: int, declared: int | None = None) -> Path:
    """A copy of the checkpoint at `src` that keeps only its first n_mtp MTP layers' tensors, its config
    declaring `declared` of them (n_mtp unless given)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["num_nextn_predict_layers"] = n_mtp if declared is None else declared
    cfg.pop("num_mtp_layers", None)
    (dst / "config.json").write_text(json.dumps(cfg))
    keep = {k: v for k, v in load_file(str(dst / "model.safetensors")).items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < N_LAYERS + n_mtp}
    save_file(keep, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst
