"""A GGUF's Q4_1 / Q4_0 / Q5_0 / Q8_0 blocks read as stored (engine/forward/quant.py, engine/forward/kernels/small_gemm_q.c): the kernel gives
the float32 kernel's bits over the dequantised weights, in any batch; the blocks are parsed as gguf-py parses
them; and a linear is taken only where its blocks are its weight exactly."""

import numpy as np
import pytest
import torch

from engine.forward import gemm, quant

FNS, NB, WHY = quant.load_kernels()
pytestmark = pytest.mark.skipif(not FNS, reason=f"no quantised kernel here: {WHY}")


def _weight(kind: str, n: int, k: int, seed: int) -> quant.QuantWeight:
    rng = np.random.default_rng(seed)
    groups = (n, k // quant.GROUP)
    d = rng.uniform(0.001, 0.05, groups).astype(np.float16).astype(np.float32)  # float16 values, as stored
    if kind == "q4_1":
        m = (-8 * d + rng.uniform(-0.01, 0.01, groups)).astype(np.float16).astype(np.float32)
        return quant.QuantWeight(kind, rng.integers(0, 16, (n, k), dtype=np.uint8), d, m)
    if kind in ("q4_0", "q5_0"):
        return quant.QuantWeight(kind, rng.integers(0, 2 * quant._OFFSET[kind], (n, k), dtype=np.uint8), d, None)
    return quant.QuantWeight(kind, rng.integers(-128, 128, (n, k), dtype=np.int8), d, None)


# the kernels of this CPU, and AVX2's 8-wide layout where this one has AVX512F (its registers limit the passes)
LAYOUTS = [()] + ([("BLOCK8",)] if NB == 16 else [])


@pytest.mark.parametrize("defines", LAYOUTS)
@pytest.mark.parametrize("kind", ["q4_1", "q8_0", "q4_0", "q5_0"])
def test_blocks_give_the_float32_kernels_bits_in_any_batch(kind, defines):
    fns, nb, _ = quant.load_kernels(defines)
    f32 = gemm.load((torch.float32,), defines=defines)
    # 13 blocks of outputs: the passes take 4, 2 or 1 blocks at a time and the last ones are left over
    w = _weight(kind, 13 * nb, 320, seed=1)
    n, k = w.q.shape
    as_read = w.as_float_kernels()  # Q4_0 through the Q4_1 kernel, Q5_0 through Q8_0's: the same weights exactly
    assert np.array_equal(as_read.dequantize(), w.dequantize())
    ours = gemm.SmallGemm(fns[as_read.kind], quant.pack(as_read, nb), k, n, torch.float32, torch.float32,
                          kind=as_read.kind)
    plain = gemm.SmallGemm.pack(f32, torch.from_numpy(w.dequantize()))
    g = torch.Generator().manual_seed(2)
    x, other = torch.randn(40, k, generator=g), torch.randn(40, n, generator=g)
    whole = ours(x)
    for m in (1, 2, 3, 4, 5, 8, 9, 10, 11, 16, 17, 24, 33, 40):
        assert torch.equal(ours(x[:m]), plain(x[:m])), m
        assert torch.equal(ours(x[:m]), whole[:m]), m
    for post in ("swish", "add", "mul"):
        extra = other if post != "swish" else None
        assert torch.equal(ours(x[:6], post, None if extra is None else extra[:6]),
                           plain(x[:6], post, None if extra is None else extra[:6])), post


@pytest.mark.parametrize("kind", ["q4_1", "q8_0", "q4_0", "q5_0"])
def test_blocks_are_read_as_gguf_py_reads_them(kind):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(3)
    values = rng.normal(0, 0.05, (8, 96)).astype(np.float32)
    qtype = GGMLQuantizationType[kind.upper()]
    raw = quantize(values, qtype)
    mine = quant._unpack(kind, raw, 8, 96)
    assert np.array_equal(mine.dequantize(), dequantize(raw, qtype).reshape(8, 96))


def test_q4_k_blocks_are_read_as_q4_1_groups_with_gguf_pys_bits():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from engine.load.kquants import quantize_q4_k

    rng = np.random.default_rng(5)
    values = rng.normal(0, 0.05, (6, 512)).astype(np.float32)
    values[1, 256:] += 0.3  # a block whose minimum is above 0: its offsets are 0
    raw = quantize_q4_k(values)
    mine = quant._unpack("q4_k", raw, 6, 512)
    assert mine.kind == "q4_1" and mine.d.shape == (6, 16)
    assert np.array_equal(mine.dequantize(), dequantize(raw, GGMLQuantizationType.Q4_K).reshape(6, 512))


def test_q6_k_blocks_are_read_with_gguf_pys_bits():
    """Every 6-bit quant in place (ggml's interleaved low nibbles and high pairs) and each sub-block of 16 its
    own scale: the same float32 weights as gguf-py's dequantize, the blocks of llama.cpp's layout."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from engine.load.kquants import quantize_q6_k

    rng = np.random.default_rng(6)
    values = rng.normal(0, 0.05, (5, 768)).astype(np.float32)
    values[2, :16] *= 20  # one sub-block far wider than the rest: its scale differs from its neighbours'
    raw = quantize_q6_k(values)
    mine = quant._unpack("q6_k", raw, 5, 768)
    assert mine.q.dtype == np.int8 and mine.q.min() >= -32 and mine.q.max() <= 31 and mine.d.shape == (5, 48)
    assert np.array_equal(mine.dequantize(), dequantize(raw, GGMLQuantizationType.Q6_K).reshape(5, 768))
    assert len(set(mine.d[2, :3].tolist())) == 3


def test_the_embedded_models_linears_are_taken_only_where_their_blocks_are_exact():
    from engine.load.models import embedded_gguf_path, load_model

    target = load_model("embedded", dtype="float32", prepack=False)
    model = target.model
    q_proj = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        q_proj.weight[5, 7] += 1e-3  # no longer what its blocks give
    taken, why = quant.attach(model, embedded_gguf_path())
    # 210 layer linears and the LM head (the Q8_0 embedding it is tied to), q and k after the rotary permutation
    assert taken == 210 and "blk.0.attn_q.weight" in why
    assert not hasattr(q_proj, "_packed_weight")
    k_proj = model.model.layers[0].self_attn.k_proj
    assert k_proj._packed_weight.kind == "q4_1" and model.lm_head._packed_weight.kind == "q8_0"
    x = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():  # the packed copy computes what the float32 weight computes (another sum order)
        torch.testing.assert_close(model.lm_head(x), x @ model.lm_head.weight.T, rtol=1e-4, atol=1e-4)
