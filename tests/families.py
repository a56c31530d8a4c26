"""Tiny models of many families, each built from its family's own transformers config class (random weights,
float32, 2 layers, hidden 64, the 64-word vocabulary of tests/tiny.py), with windows of WINDOW positions so that
prompts and answers cross them."""

from __future__ import annotations

from pathlib import Path

import torch

from tiny import WORDS, make_tokenizer

WINDOW = 16
COMMON = dict(vocab_size=len(WORDS), hidden_size=64, num_hidden_layers=2, num_attention_heads=4, bos_token_id=1,
              eos_token_id=2, pad_token_id=3, tie_word_embeddings=False, max_position_embeddings=256)
ATTN = dict(intermediate_size=128, num_key_value_heads=2)

# family -> (config class, model class, what the family's config adds); the classes are transformers' names
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(ATTN)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW, **ATTN)),
    # layers from max_window_layers on are windowed: one global layer, one windowed
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=WINDOW,
                                                      max_window_layers=1, **ATTN)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, **ATTN)),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16, **ATTN)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=WINDOW,
                                                         attn_logit_softcapping=5.0, final_logit_softcapping=10.0,
                                                         **ATTN)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16, sliding_window=WINDOW,
                                                             sliding_window_pattern=2, **ATTN)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(ATTN)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(n_embd=64, n_layer=2, n_head=4, n_positions=256)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(intermediate_size=128)),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(ffn_dim=128, word_embed_proj_dim=64)),
    "falcon": ("FalconConfig", "FalconForCausalLM", dict(new_decoder_architecture=True, num_kv_heads=2)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(ATTN)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(ATTN)),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(ATTN)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layer_interval=2, **ATTN)),  # layer 2: NoPE
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(sliding_window=WINDOW, sliding_window_pattern=2,
                                                            **ATTN)),
}
# families whose positions the cell cache cannot express: refused at load, with what the reason names
REFUSED = {
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(n_layer=2, n_head=4), "ALiBi"),
    "mpt": ("MptConfig", "MptForCausalLM", dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=256), "ALiBi"),
    "falcon-alibi": ("FalconConfig", "FalconForCausalLM", dict(alibi=True, num_kv_heads=4), "ALiBi"),
}
_NOT_THEIRS = {  # names COMMON gives that these configs spell otherwise
    "gpt2": ("hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings"),
    "mpt": ("hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings"),
}


def build(family: str, seed: int = 0):
    """The family's tiny model in eval mode, float32, seeded."""
    import transformers as tf

    cfg_name, model_name, extra = (FAMILIES.get(family) or REFUSED[family])[:3]
    kwargs = {**COMMON, **extra}
    for k in _NOT_THEIRS.get(family, ()):
        kwargs.pop(k, None)
    torch.manual_seed(seed)
    model = getattr(tf, model_name)(getattr(tf, cfg_name)(**kwargs)).eval()
    with torch.no_grad():  # sharper logits than a fresh init: greedy text with structure, few near-ties
        model.get_output_embeddings().weight.mul_(8.0)
    return model


def save_family(root: Path, family: str, seed: int = 0) -> Path:
    path = root / family
    build(family, seed).save_pretrained(path)
    make_tokenizer(WORDS).save_pretrained(path)
    return path
