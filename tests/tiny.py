"""Tiny models built from configs, saved to a directory and loaded back through the real loading code."""

from __future__ import annotations

import os
from pathlib import Path

import torch

WORDS = ["<unk>", "<s>", "</s>", "<pad>", "<sep>"] + [f"w{i}" for i in range(59)]  # 64 tokens


def make_tokenizer(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def make_llama(seed: int, vocab_size: int = 64, layers: int = 2, hidden: int = 64, **extra):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                      **{"tie_word_embeddings": False, **extra})
    model = LlamaForCausalLM(cfg).eval()
    # sharper logits than a fresh init so greedy text has structure (repeats) and ties are rare
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def save_tiny(path: Path, seed: int, words: list[str] | None = None, **extra) -> Path:
    words = words or WORDS
    model = make_llama(seed, vocab_size=len(words), **extra)
    model.save_pretrained(path)
    make_tokenizer(words).save_pretrained(path)
    return path


def suite_dtype() -> str:
    """The weights' dtype the suite runs in: SPECPLAY_TEST_DTYPE (float32 unless set; `make test` also runs the
    lossless tests in bfloat16 where the CPU computes it natively)."""
    return os.environ.get("SPECPLAY_TEST_DTYPE", "float32")


def load_tiny(path: Path):
    from engine.load.models import load_model

    return load_model(str(path), device="cpu", dtype=suite_dtype())


def make_arch(arch: str, seed: int, vocab_size: int = 64):
    """A tiny model of another family: recurrent (mamba, mamba2), hybrid (jamba: attention + Mamba layers;
    lfm2: attention + short convolutions) or sliding-window attention (mistral, window 6)."""
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                  tie_word_embeddings=False)
    attn = dict(intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    if arch == "mamba":
        model = tf.MambaForCausalLM(tf.MambaConfig(num_hidden_layers=2, state_size=8, **common))
    elif arch == "mamba2":
        model = tf.Mamba2ForCausalLM(tf.Mamba2Config(num_hidden_layers=2, state_size=16, expand=2, n_groups=1,
                                                     head_dim=16, num_heads=8, chunk_size=8, **common))
    elif arch == "jamba":
        model = tf.JambaForCausalLM(tf.JambaConfig(
            num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
            expert_layer_offset=1, num_experts=2, mamba_d_state=8, mamba_expand=2, **attn, **common))
    elif arch == "lfm2":
        model = tf.Lfm2ForCausalLM(tf.Lfm2Config(num_hidden_layers=3, layer_types=["conv", "full_attention", "conv"],
                                                 **attn, **common))
    elif arch == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(num_hidden_layers=2, sliding_window=6,
                                                       max_position_embeddings=1024, **attn, **common))
    else:
        raise ValueError(arch)
    model.eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharper logits: greedy text with structure, few near-ties
    return model


def save_arch(path: Path, arch: str, seed: int = 0) -> Path:
    make_arch(arch, seed).save_pretrained(path)
    make_tokenizer(WORDS).save_pretrained(path)
    return path
