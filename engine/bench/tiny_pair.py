"""A tiny random Llama target and a draft close to it, for checks that need no download (engine.bench.dist).

Both are saved with a word-level tokenizer and loaded back through engine.load.models.load_model, so the check runs
the same loading, cache and drafter code as a real model. The draft is the target with its weights perturbed:
a draft that agrees with the target about half the time exercises both branches of rejection sampling (accept,
and the residual draw after a rejection); an unrelated random draft would almost always be rejected.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch

WORDS = ["<unk>", "<s>", "</s>", "<pad>", "<sep>"] + [f"w{i}" for i in range(59)]
PROMPT = "w10 w11 w12 w13 w14 w15 w16 w17 w18 w19"  # in the tiny vocabulary


@dataclass
class TinyPairParams:
    seed: int = 0  # of the generator that draws every weight
    hidden: int = 64
    layers: int = 2
    sharpen: float = 16.0  # lm_head scale: a fresh init is near uniform; sharper logits give a few likely tokens
    draft_noise: float = 0.3  # the draft's perturbation, relative to each weight matrix's spread


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def _llama(p: TinyPairParams, gen: torch.Generator):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(WORDS), hidden_size=p.hidden, intermediate_size=2 * p.hidden,
                      num_hidden_layers=p.layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # every matrix redrawn from our generator (the constructor's own init uses the global one)
        for w in model.parameters():
            if w.dim() > 1:
                w.copy_(torch.randn(w.shape, generator=gen) * cfg.initializer_range)
        model.lm_head.weight.mul_(p.sharpen)
    return model


def build_pair(root: Path, params: TinyPairParams | None = None) -> tuple[Path, Path]:
    """Save the target and its draft under `root`; returns their directories."""
    p = params or TinyPairParams()
    gen = torch.Generator().manual_seed(p.seed)
    target = _llama(p, gen)
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for w in draft.parameters():
            if w.dim() > 1:
                w.add_(torch.randn(w.shape, generator=gen) * p.draft_noise * float(w.std()))
    out = []
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
        _tokenizer().save_pretrained(root / name)
        out.append(root / name)
    return out[0], out[1]
