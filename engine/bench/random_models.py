"""Models with random weights built from configs: the shapes of real models without downloading any.

What a forward costs depends on the shapes and the dtype, not on the values, and losslessness is a property of
the engine, not of the weights: so a GPU check (scripts/gpu_check.py) and the device tests run on these. Every
shape takes the embedded model's tokenizer (a real vocabulary, which grammars need), so its vocabulary is that
one's 49152 ids whatever the real model's (Llama-3's LM head has 128256 rows: a few percent of the 8B's bytes).
`small` keeps each family's layout (grouped-query ratio, head size, RoPE, sliding layers) at a toy width.
"""

from __future__ import annotations

from dataclasses import dataclass

SHAPES = ("embedded", "llama3-8b", "gemma3")


@dataclass
class Shape:
    family: str  # "llama" or "gemma3"
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float


FULL = {  # the published configs' widths
    "embedded": Shape("llama", 576, 1536, 30, 9, 3, 64, 100000.0),  # SmolLM2-135M
    "llama3-8b": Shape("llama", 4096, 14336, 32, 32, 8, 128, 500000.0),  # Meta-Llama-3-8B
    "gemma3": Shape("gemma3", 2560, 10240, 34, 8, 4, 256, 1000000.0),  # gemma-3-4b's text model
}
SMALL = {
    "embedded": Shape("llama", 64, 128, 2, 4, 2, 16, 100000.0),
    "llama3-8b": Shape("llama", 128, 256, 2, 8, 2, 16, 500000.0),
    "gemma3": Shape("gemma3", 64, 128, 2, 2, 1, 32, 1000000.0),
}


def config_of(name: str, small: bool, vocab_size: int):
    """The transformers config of shape `name` (SHAPES). Raises ValueError for an unknown one."""
    table = SMALL if small else FULL
    if name not in table:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {name!r}")
    s = table[name]
    common = dict(vocab_size=vocab_size, hidden_size=s.hidden, intermediate_size=s.intermediate,
                  num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                  head_dim=s.head_dim, max_position_embeddings=8192, bos_token_id=1, eos_token_id=2,
                  pad_token_id=2, tie_word_embeddings=False)
    if s.family == "gemma3":
        from transformers import Gemma3TextConfig

        # Gemma-3's five sliding layers to one global; a window wider than any sequence here, so both kinds
        # see the same cells and the cell cache's one window is exact for all of them
        kinds = [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(s.layers)]
        return Gemma3TextConfig(sliding_window=4096, layer_types=kinds,
                                rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta}, **common)
    from transformers import LlamaConfig

    return LlamaConfig(rope_theta=s.rope_theta, **common)


def random_model(name: str, small: bool, device: str = "cpu", dtype: str = "float32", seed: int = 0,
                 tokenizer=None):
    """A LoadedModel of shape `name` with random weights, built on `device` in `dtype`. Its LM head is scaled
    up so that greedy text has structure (a fresh init gives near-uniform logits, where every near-tie is a
    coin toss of rounding)."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.load.gguf import embedded_tokenizer
    from engine.load.models import LoadedModel

    tok = tokenizer if tokenizer is not None else embedded_tokenizer()
    cfg = config_of(name, small, len(tok))
    torch.manual_seed(seed)
    torch_dtype = getattr(torch, dtype)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype)
    model.eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    n_params = sum(p.numel() for p in model.parameters())
    return LoadedModel(model=model, tokenizer=tok, name=f"random-{name}{'-small' if small else ''}",
                       quant_bits=16 if dtype == "bfloat16" else 32, n_params=n_params, device=str(device),
                       dtype=dtype, dtype_reason="random weights built from a config")
