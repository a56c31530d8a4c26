"""A GGUF's Q4_1 / Q4_0 / Q5_0 / Q8_0 / Q6_K blocks times 8-bit inputs, summed in integers (engine/forward/kernels/small_gemm_qdot.c,
engine/forward/quant_dot.py): llama.cpp's arithmetic to the rounding of its float32 steps, a row's bits the same in any
batch and either vector width, the embedded model lossless on it, and the dtype choice that takes it."""

import numpy as np
import pytest
import torch

from engine.forward import gemm, quant, quant_dot

FNS, NB, WHY = quant.load_kernels()
WHY_NOT = WHY or quant_dot.dot_reason()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=f"no integer kernel here: {WHY_NOT}")
LAYOUTS = [()] + ([("BLOCK8",)] if NB == 16 else [])


def _weight(kind: str, n: int, k: int, seed: int) -> quant.QuantWeight:
    rng = np.random.default_rng(seed)
    if kind == "q6_k":  # q - 32 in [-32, 31], a scale (float16 d times an int8) per sub-block of 16
        d = (rng.uniform(1e-4, 1e-3, (n, k // 16)).astype(np.float16).astype(np.float32)
             * rng.integers(-128, 128, (n, k // 16)).astype(np.float32))
        return quant.QuantWeight(kind, rng.integers(-32, 32, (n, k), dtype=np.int8), d, None)
    groups = (n, k // quant.GROUP)
    d = rng.uniform(0.001, 0.05, groups).astype(np.float16).astype(np.float32)
    if kind == "q4_1":
        m = (-8 * d + rng.uniform(-0.01, 0.01, groups)).astype(np.float16).astype(np.float32)
        return quant.QuantWeight(kind, rng.integers(0, 16, (n, k), dtype=np.uint8), d, m)
    if kind in ("q4_0", "q5_0"):
        return quant.QuantWeight(kind, rng.integers(0, 2 * quant._OFFSET[kind], (n, k), dtype=np.uint8), d, None)
    return quant.QuantWeight(kind, rng.integers(-128, 128, (n, k), dtype=np.int8), d, None)


KINDS = ["q4_1", "q8_0", "q4_0", "q5_0", "q6_k"]


def _llama_cpp(w: quant.QuantWeight, x: np.ndarray) -> np.ndarray:
    """y [M, N] in float64 from llama.cpp's quantities: each row's groups of 32 as d = max|x| / 127 and
    q = round(x / d) (ggml's quantize_row_q8_1), then d_w d_x sum(q_w q_x) (+ m_w d_x sum(q_x) for Q4_1), summed
    per weight group (16 for Q6_K's sub-blocks, else 32)."""
    m_rows, k = x.shape
    xg = x.reshape(m_rows, k // 32, 32)
    d = np.abs(xg).max(-1) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    gs = w.group
    q = np.rint(xg * inv[..., None]).astype(np.int64).reshape(m_rows, k // gs, gs)
    wq = w.q.reshape(w.q.shape[0], k // gs, gs).astype(np.int64) - quant._OFFSET.get(w.kind, 0)
    dots = np.einsum("mgk,ngk->mng", q, wq).astype(np.float64)
    d_x = np.repeat(d, 32 // gs, axis=1)  # each weight group's inputs' scale
    y = (dots * (w.d[None].astype(np.float64) * d_x[:, None, :])).sum(-1)
    if w.m is not None:
        y += (w.m[None].astype(np.float64) * (d * q.sum(-1))[:, None, :]).sum(-1)
    return y


def _kernel(kind: str, w: quant.QuantWeight, defines=()) -> gemm.SmallGemm:
    fns, nb, _ = quant.load_kernels(defines)
    n, k = w.q.shape
    return gemm.SmallGemm(fns[kind + "_dot"], quant.pack_dot(w, nb), k, n, torch.float32, torch.float32,
                          kind=kind + "_dot")


def _inputs(rows: int, k: int) -> torch.Tensor:
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(2))
    x[1, :32] = 0.0  # a group of zeros: scale 0, quants 0
    x[2, 40] = 80.0  # an outlier: its group's other inputs round to few levels
    return x


@pytest.mark.parametrize("kind", KINDS)
def test_the_integer_kernel_computes_llama_cpps_sums(kind):
    w = _weight(kind, 5 * NB, 320, seed=1)
    x = _inputs(9, 320)
    ours = _kernel(kind, w)(x).double().numpy()
    ref = _llama_cpp(w, x.numpy())
    assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max()
    exact = x.double().numpy() @ w.dequantize().astype(np.float64).T  # the 8-bit inputs are an approximation
    assert np.abs(ours - exact).max() > 1e-4 * np.abs(exact).max()


@pytest.mark.parametrize("kind", KINDS)
def test_the_integer_sums_hold_at_the_extreme_quants(kind):
    # every weight and input at the end of its range: a group's products are as large as they get, which is
    # where 16-bit partial sums (AVX2's byte pairs) would saturate or wrap
    n, k = 2 * NB, 64
    d = np.full((n, k // quant.GROUP), 0.01, np.float32)
    if kind == "q4_1":
        w = quant.QuantWeight(kind, np.full((n, k), 15, np.uint8), d, -8 * d)
    elif kind == "q6_k":  # the most negative quant at the largest scale, then the most positive
        q = np.full((n, k), -32, np.int8)
        q[NB:] = 31
        w = quant.QuantWeight(kind, q, np.full((n, k // 16), 0.01, np.float32), None)
    elif kind in ("q4_0", "q5_0"):  # the largest stored quants, then the smallest (most negative once offset)
        q = np.full((n, k), 2 * quant._OFFSET[kind] - 1, np.uint8)
        q[NB:] = 0
        w = quant.QuantWeight(kind, q, d, None)
    else:
        q = np.full((n, k), -128, np.int8)
        q[NB:] = 127
        w = quant.QuantWeight(kind, q, d, None)
    x = torch.ones(4, k)
    x[1] = -1.0
    x[2, ::2] = -1.0  # alternating signs: pairs of opposite products
    x[3, :32] = -1.0
    ours = _kernel(kind, w)(x).double().numpy()
    ref = _llama_cpp(w, x.numpy())
    assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max()
    assert np.abs(ref[0]).min() > 0.1  # the first row's sums are large: 64 * 127 * 15 (Q4_1), 64 * 127 * 128


@pytest.mark.parametrize("defines", LAYOUTS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_integer_kernel_gives_a_row_its_bits_in_any_batch_and_width(kind, defines):
    # 13 blocks of outputs: tasks take 4, 2 or 1 blocks and the last ones are left over
    w = _weight(kind, 13 * NB, 320, seed=3)
    x = _inputs(40, 320)
    other = torch.randn(40, 13 * NB, generator=torch.Generator().manual_seed(4))
    reference, ours = _kernel(kind, w), _kernel(kind, w, defines)
    whole = reference(x)
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 25, 40):
        assert torch.equal(ours(x[:m]), whole[:m]), m
        assert torch.equal(ours(x[m - 1:m]), whole[m - 1:m]), m  # the row alone
    for post in ("swish", "add", "mul"):
        extra = None if post == "swish" else other[:6]
        assert torch.equal(ours(x[:6], post, extra), reference(x[:6], post, extra)), post


def test_a_float_linear_quantised_to_q8_0_computes_close_to_its_weights():
    weight = torch.randn(3 * NB, 96, generator=torch.Generator().manual_seed(5))
    lin = torch.nn.Linear(96, 3 * NB, bias=False)
    with torch.no_grad():
        lin.weight.copy_(weight)
    assert quant_dot.pack_linear_q8_0(lin) and lin._packed_weight.kind == "q8_0_dot" and not hasattr(lin, "weight")
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(6))
    exact = x @ weight.T
    with torch.no_grad():
        assert (lin(x) - exact).abs().max() < 0.02 * exact.abs().max()  # two 8-bit roundings
    q = quant_dot.quantize_q8_0(weight.numpy())
    assert np.abs(q.q).max() == 127 and np.abs(q.dequantize() - weight.numpy()).max() <= q.d.max() / 2 + 1e-7


def test_int8_is_refused_with_a_reason_where_there_are_no_blocks(tiny_target):
    from engine.load.dtype import choose_dtype

    choice = choose_dtype("int8", tiny_target.model.config, "cpu", blocks="")
    assert choice.dtype == "float32" and "int8 needs" in choice.reason and choice.torch_name == "float32"


@pytest.mark.parametrize("ms,expected", [({"q4_1": 2.0, "q4_1_dot": 1.0}, "int8"),
                                         ({"q4_1": 1.0, "q4_1_dot": 0.99}, "float32")])
def test_auto_takes_int8_for_blocks_where_it_is_timed_faster(monkeypatch, tiny_target, ms, expected):
    from engine.load.dtype import choose_dtype

    monkeypatch.setattr(quant_dot, "time_kernels", lambda layer: ms)
    choice = choose_dtype("auto", tiny_target.model.config, "cpu", blocks="Q4_1, Q8_0")
    assert choice.dtype == expected and choice.torch_name == "float32" and "ms in int8" in choice.reason


def test_speculation_on_the_int8_embedded_model_is_token_identical():
    from engine.draft.registry import NGRAM_CHAIN
    from engine.load.models import load_model
    from engine.params import GenParams, SpecParams
    from engine.forward.prepack import linear_paths
    from engine.serve.engine import Engine

    target = load_model("embedded", dtype="int8")
    assert target.dtype == "int8" and "q4_1_dot kernel 210" in linear_paths(target.model)
    engine = Engine(target, n_ctx=1024, n_seq_max=2)
    assert engine.probe.kind == "PART"
    ids = target.encode_chat([{"role": "user", "content": "Repeat exactly: the red fox jumps over the red "
                                                          "fox and the lazy dog sleeps by the red fox."}])

    def run(types, tree_nodes=0):
        params = GenParams(max_new_tokens=40, spec=SpecParams(types=types, tree_nodes=tree_nodes))
        return [t for ev in engine.generate(ids, params) for t in ev.emitted]

    plain = run([])
    assert run(NGRAM_CHAIN) == plain
    assert run(NGRAM_CHAIN + ["draft-head"], tree_nodes=16) == plain
    head = engine.drafter("draft-head").head  # beside an int8 target: Q8_0 groups on the same kernel
    assert head.step is not None and head.step.dot == 1 and head.lm._packed_weight.kind == "q8_0_dot"
