"""A random EAGLE-3 head of the embedded model's width (SmolLM2-135M: hidden 576, 9 heads, 3 key-value heads, MLP
1536, vocabulary 49152) in the EAGLE authors' layout, with a 32000-token draft vocabulary: what a head step
costs beside that target in each path of engine/draft/lin_path.py, in the arena. Untrained: its drafts are
almost never kept, so it measures cost, not acceptance.

    .venv/bin/python scripts/wide_eagle3.py OUT
    .venv/bin/python -m engine.bench.arena --prompts assets/prompts/unseen.jsonl --limit 1 --draft OUT \
        --head-dtype auto
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

H, HEADS, KV, INTER, VOCAB, DRAFT_VOCAB = 576, 9, 3, 1536, 49152, 32000


def main(out: str) -> int:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    d = H // HEADS

    def w(*shape):
        return torch.randn(*shape, generator=g) / shape[-1] ** 0.5

    layer = {"self_attn.q_proj.weight": w(HEADS * d, 2 * H), "self_attn.k_proj.weight": w(KV * d, 2 * H),
             "self_attn.v_proj.weight": w(KV * d, 2 * H), "self_attn.o_proj.weight": w(H, HEADS * d),
             "mlp.gate_proj.weight": w(INTER, H), "mlp.up_proj.weight": w(INTER, H),
             "mlp.down_proj.weight": w(H, INTER)}
    for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        layer[f"{name}.weight"] = torch.ones(H)
    tensors = {"fc.weight": w(H, 3 * H), "norm.weight": torch.ones(H), "lm_head.weight": w(DRAFT_VOCAB, H),
               "d2t": torch.zeros(DRAFT_VOCAB, dtype=torch.long),
               **{f"midlayer.{k}": v for k, v in layer.items()}}
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": DRAFT_VOCAB, "hidden_size": H,
           "num_attention_heads": HEADS, "num_key_value_heads": KV, "intermediate_size": INTER,
           "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "num_hidden_layers": 1,
           "max_position_embeddings": 8192, "hidden_act": "silu", "model_type": "llama"}
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(path / "model.safetensors"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
