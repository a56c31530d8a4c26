"""The lean Llama-family forward: the logits and hidden states of transformers' forward for every family it takes,
on the cell cache with several sequences and a removed tail; rows bit-identical alone and in a verification
batch in both dtypes; a clear reason wherever it steps aside."""

import shutil

import pytest
import torch

from engine.forward import prepack
from engine.batch import Batch
from engine.memory.context import ModelContext
from engine.forward.lean import lean_reason

pytestmark = pytest.mark.skipif(not prepack.available(), reason="this torch has no oneDNN linear ops")
BF16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _family(kind: str, seed: int = 0):
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False,
                  max_position_embeddings=512)
    if kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**common))
    elif kind == "llama-rope-scaled":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}, **common))
    elif kind == "qwen2":  # biases on q, k, v
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**common))
    elif kind == "qwen3":  # per-head RMSNorm of q and k
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(head_dim=16, **common))
    elif kind == "mistral":  # every layer sliding, window 6: the cell cache's mask
        model = tf.MistralForCausalLM(tf.MistralConfig(sliding_window=6, **common))
    elif kind == "qwen2-mixed":  # full layers, then windowed ones: a layout per kind
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(use_sliding_window=True, sliding_window=4, max_window_layers=1,
                                                   layer_types=["full_attention"] + ["sliding_attention"] * 2,
                                                   **common))
    elif kind == "gemma2":  # norms on each branch's output, GELU, soft-capped scores and logits, windows of 4
        model = tf.Gemma2ForCausalLM(tf.Gemma2Config(
            head_dim=16, query_pre_attn_scalar=24, sliding_window=4, attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            **common))
    elif kind == "smollm3":  # a layer without rotary
        model = tf.SmolLM3ForCausalLM(tf.SmolLM3Config(no_rope_layers=[1, 0, 1], **common))
    elif kind == "olmo2":  # norms on each branch's output only, q and k normed over the whole projection
        model = tf.Olmo2ForCausalLM(tf.Olmo2Config(**common))
    elif kind == "phi3":  # q, k, v in one linear, gate and up in another, rotary over half of each head
        model = tf.Phi3ForCausalLM(tf.Phi3Config(partial_rotary_factor=0.5, **common))
    elif kind == "phi3-full":  # Phi-3 mini's whole-head rotary: its fused linears split for the C layers
        model = tf.Phi3ForCausalLM(tf.Phi3Config(**common))
    elif kind == "gemma3":  # per-head norms, local and global rotary bases
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(
            head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"], **common))
    else:
        raise ValueError(kind)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias" in name or "norm" in name:
                p.normal_(0, 0.5)  # a fresh init leaves biases and Gemma's norms at 0, which would test nothing
    return model


def _decode(ctx, rows: list[tuple[int, int, int]]):
    batch = Batch()
    for tok, pos, seq in rows:
        batch.add(tok, pos, seq, True)
    return ctx.decode(batch)


@pytest.mark.parametrize("kind", ["llama", "llama-rope-scaled", "qwen2", "qwen3", "mistral", "qwen2-mixed", "gemma2",
                                  "gemma3", "smollm3", "olmo2", "phi3", "phi3-full"])
def test_lean_forward_gives_transformers_logits_and_hidden_states(kind):
    model = _family(kind)
    prepack.prepack_linears(model)
    assert lean_reason(model) is None
    results = {}
    for lean in (True, False):
        ctx = ModelContext(model, n_ctx=64, n_seq_max=2, lean=lean)
        assert (ctx.lean is not None) == lean
        ctx.hidden_layers = (0, 1, 3)  # embeddings, after layer 1, the final norm
        a = [(5 + i % 7, i, 0) for i in range(9)] + [(9 + i % 5, i, 1) for i in range(5)]
        first = _decode(ctx, a)
        ctx.seq_rm(0, 6, -1)  # a rejected tail
        second = _decode(ctx, [(11, 6, 0), (12, 7, 0), (13, 5, 1)])
        results[lean] = (first, second)
    for got, want in zip(results[True], results[False]):
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got.hidden, want.hidden, rtol=1e-4, atol=1e-4)


def _context(model, n_ctx: int, kernel: bool) -> ModelContext:
    ctx = ModelContext(model, n_ctx=n_ctx, n_seq_max=2, attention_kernel=kernel)
    if kernel and shutil.which("cc") is None:
        pytest.skip("no C compiler: the attention kernel cannot be built")
    assert (ctx.attention.kernel is not None) == kernel, ctx.attention.reason
    return ctx


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
@pytest.mark.parametrize("dtype", ["float32"] + (["bfloat16"] if BF16 else []))
def test_a_verified_row_has_the_logits_of_plain_decoding_bit_for_bit(dtype, kernel):
    """What makes greedy speculation token-identical in any dtype: the rows of a verification batch get the very
    logits plain decoding computes one row at a time (packed linears and per-row attention, see attention.py)."""
    model = _family("llama").to(getattr(torch, dtype))
    prepack.prepack_linears(model)
    ctx = _context(model, 64, kernel)
    prompt = [(5 + i % 9, i, 0) for i in range(10)]
    _decode(ctx, prompt)
    tail = [7, 21, 3, 40, 12, 9]
    one = [_decode(ctx, [(t, 10 + i, 0)]).logits[0] for i, t in enumerate(tail)]
    ctx.seq_rm(0, 10, -1)
    batch = _decode(ctx, [(t, 10 + i, 0) for i, t in enumerate(tail)]).logits
    for i in range(len(tail)):
        assert torch.equal(one[i], batch[i]), f"row {i} differs"
    # beside another sequence's rows too (several slots in one forward)
    ctx.seq_rm(0, 10, -1)
    _decode(ctx, [(t, i, 1) for i, t in enumerate([4, 5, 6])])
    mixed = _decode(ctx, [(t, 10 + i, 0) for i, t in enumerate(tail)] + [(8, 3, 1)]).logits
    assert torch.equal(mixed[: len(tail)], batch)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
@pytest.mark.parametrize("dtype", ["float32"] + (["bfloat16"] if BF16 else []))
def test_a_prompt_prefilled_at_once_or_in_parts_leaves_the_same_cache(dtype, kernel):
    """Prefix reuse: a prompt whose first part is already cached and whose rest is forwarded alone must give the
    logits (and the following steps) of the same prompt prefilled in one batch."""
    model = _family("llama").to(getattr(torch, dtype))
    prepack.prepack_linears(model)
    ctx = _context(model, 128, kernel)
    prompt = [5 + (i * 7) % 50 for i in range(40)]
    whole = _decode(ctx, [(t, i, 0) for i, t in enumerate(prompt)]).logits[-1]
    _decode(ctx, [(t, i, 1) for i, t in enumerate(prompt[:23])])
    parts = _decode(ctx, [(t, 23 + i, 1) for i, t in enumerate(prompt[23:])]).logits[-1]
    assert torch.equal(whole, parts)
    steps = [_decode(ctx, [(9, 40, 0), (9, 40, 1)]).logits, _decode(ctx, [(4, 41, 0), (4, 41, 1)]).logits]
    assert all(torch.equal(s[0], s[1]) for s in steps)


def test_families_and_models_the_lean_forward_does_not_take_say_why():
    import transformers as tf

    torch.manual_seed(0)
    unpacked = _family("llama")
    assert "not prepacked" in lean_reason(unpacked)
    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2)).eval()
    prepack.prepack_linears(gpt2)
    assert "transformers' forward" in lean_reason(gpt2)
    exact_gelu = tf.Gemma2ForCausalLM(tf.Gemma2Config(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, hidden_activation="gelu")).eval()
    prepack.prepack_linears(exact_gelu)
    assert "activation gelu" in lean_reason(exact_gelu)
    assert ModelContext(exact_gelu, n_ctx=16).lean is None  # it runs, on transformers' forward


@pytest.mark.parametrize("kind", ["mistral", "qwen2", "qwen2-mixed", "qwen3", "gemma3", "smollm3", "olmo2",
                                  "phi3-full"])
def test_fused_layers_run_as_the_torch_layers_do(kind):
    """The one-call C layers (engine/forward/lean_fused.py): taken for a float32 model on our kernels, with the
    logits, hidden states and cache of the torch layers within rounding; a window over every layer (Mistral),
    per-head norms (Qwen3), Gemma 3's norms on each branch, GELU, and local and global layers with their own
    cells and rotary tables, a layer without rotary (SmolLM3), OLMo 2's post-norms and whole q and k norms, Qwen2's
    q, k and v biases, Phi-3's fused linears split on the kernel's blocks; several sequences and a removed tail."""
    from engine.forward import gemm

    if gemm.load((torch.float32,)).get(torch.float32) is None:
        pytest.skip("our float32 kernel does not run here")
    model = _family(kind)
    prepack.prepack_linears(model)
    results = {}
    for fused in (True, False):
        ctx = _context(model, 64, True)
        assert ctx.lean.fused is not None, ctx.lean.fused_reason
        if not fused:
            ctx.lean.fused = None
        ctx.hidden_layers = (0, 2, 3)
        first = _decode(ctx, [(5 + i % 7, i, 0) for i in range(9)] + [(9 + i % 5, i, 1) for i in range(5)])
        ctx.seq_rm(0, 6, -1)
        ctx.hidden_layers = (1, 2)  # inner layers only: the one-call path hands its own side-by-side buffer
        second = _decode(ctx, [(11, 6, 0), (12, 7, 0), (13, 5, 1)])
        results[fused] = (first.logits, first.hidden, second.logits, second.hidden, ctx.cache.k[1][0, :, :17],
                          ctx.cache.v[2][0, :, :17])
        assert second.hidden.shape == (3, 2 * model.config.hidden_size)
    for got, want in zip(results[True], results[False]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_fused_layers_say_why_they_step_aside():
    import transformers as tf

    torch.manual_seed(0)
    biased = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attention_bias=True)).eval()  # o_proj's bias too
    prepack.prepack_linears(biased)
    assert "biases other than" in ModelContext(biased, n_ctx=16).lean.fused_reason
    gemma2 = _family("gemma2")
    prepack.prepack_linears(gemma2)
    assert "soft-capped" in ModelContext(gemma2, n_ctx=16).lean.fused_reason
    phi3 = _family("phi3")
    prepack.prepack_linears(phi3)
    assert "partial rotary" in ModelContext(phi3, n_ctx=16).lean.fused_reason
