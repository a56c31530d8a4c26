"""No native call takes the process down: every C kernel is driven over 0 to 64 rows and several widths against
its torch reference, and the shapes a kernel does not take are refused on the Python side before any C call."""

import numpy as np
import pytest
import torch

from engine.forward import gemm, prepack, quant
from engine.forward.attention import CellLayout, RowAttention
from engine.draft.head.step import _rows as head_rows

ROWS = range(0, 65)
KERNELS = gemm.load()
QUANT_FNS, QUANT_NB, QUANT_WHY = quant.load_kernels()
FLOAT_DTYPES = [pytest.param(dt, marks=pytest.mark.skipif(KERNELS.get(dt) is None,
                                                          reason=f"no {dt} kernel here: {KERNELS.why_not.get(dt)}"))
                for dt in (torch.float32, torch.float16, torch.bfloat16)]
TOL = {torch.float32: 1e-5, torch.float16: 1e-5, torch.bfloat16: 2e-2}


def _x(rows: int, k: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _check_rows(lin: gemm.SmallGemm, reference, k: int, act: torch.dtype, tol: float) -> None:
    """Every row count 0..64: the right shape, the reference's values, the bits of the same rows in a bigger
    batch, and the fused epilogues over the same rows."""
    x = _x(64, k, act)
    other = _x(64, lin.n, act, seed=1)
    whole = lin(x)
    scale = float(reference(x).abs().max()) + 1.0
    for m in ROWS:
        y = lin(x[:m])
        assert y.shape == (m, lin.n), m
        assert torch.equal(y, whole[:m]), m
        added = lin(x[:m], "add", other[:m])
        assert added.shape == (m, lin.n)
        if m:
            torch.testing.assert_close(y.double(), reference(x[:m]), rtol=tol, atol=tol * scale)
            torch.testing.assert_close(added.double(), y.double() + other[:m].double(), rtol=tol, atol=tol * scale)
    assert lin(x[:0].reshape(0, 3, k)).shape == (0, 3, lin.n)  # no rows in any leading shape


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n_blocks,k", [(1, 32), (3, 96), (5, 600)])
def test_float_kernels_over_every_row_count(dtype, n_blocks, k):
    block = KERNELS.get(dtype)[2]
    w = (torch.randn(n_blocks * block, k, generator=torch.Generator().manual_seed(k)) / k ** 0.5).to(dtype)
    lin = gemm.SmallGemm.pack(KERNELS, w)
    assert lin is not None
    _check_rows(lin, lambda x: x.double() @ w.double().T, k, gemm.SPECS[dtype].act or dtype, TOL[dtype])


@pytest.mark.skipif(not QUANT_FNS, reason=f"no quantised kernels here: {QUANT_WHY}")
@pytest.mark.parametrize("kind", ["q4_1", "q8_0", "q4_1_dot", "q8_0_dot"])
@pytest.mark.parametrize("n_blocks,k", [(1, 32), (3, 320)])
def test_quantised_kernels_over_every_row_count(kind, n_blocks, k):
    if kind not in QUANT_FNS:
        pytest.skip("the integer kernel does not run on this CPU")
    base = kind.removesuffix("_dot")
    rng = np.random.default_rng(k)
    n = n_blocks * QUANT_NB
    groups = (n, k // quant.GROUP)
    d = rng.uniform(0.001, 0.05, groups).astype(np.float16).astype(np.float32)
    if base == "q4_1":
        m = (-8 * d).astype(np.float16).astype(np.float32)
        w = quant.QuantWeight(base, rng.integers(0, 16, (n, k), dtype=np.uint8), d, m)
    else:
        w = quant.QuantWeight(base, rng.integers(-128, 128, (n, k), dtype=np.int8), d, None)
    dense = torch.from_numpy(np.repeat(d, quant.GROUP, axis=1) * w.q.astype(np.float32)
                             + (np.repeat(w.m, quant.GROUP, axis=1) if w.m is not None else 0)).double()
    packed = quant.pack_dot(w, QUANT_NB) if kind.endswith("_dot") else quant.pack(w, QUANT_NB)
    lin = gemm.SmallGemm(QUANT_FNS[kind], packed, k, n, torch.float32, torch.float32, kind=kind)
    # 8-bit inputs round each group to 1/127 of its largest value: within 2% of the outputs' scale
    _check_rows(lin, lambda x: x.double() @ dense.T, k, torch.float32, 2e-2 if kind.endswith("_dot") else 1e-5)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_shapes_a_kernel_does_not_take_are_refused_before_the_call(dtype):
    block = KERNELS.get(dtype)[2]
    w = torch.randn(2 * block, 64).to(dtype)
    assert gemm.SmallGemm.pack(KERNELS, torch.randn(block + 1, 64).to(dtype)) is None  # outputs off-block
    lin = gemm.SmallGemm.pack(KERNELS, w)
    act = gemm.SPECS[dtype].act or dtype
    with pytest.raises(ValueError, match="width 63"):
        lin(_x(4, 63, act))
    with pytest.raises(ValueError, match="operand"):
        lin(_x(4, 64, act), "add", _x(3, 2 * block, act))
    with pytest.raises(ValueError, match="epilogue"):
        lin(_x(4, 64, act), "add")
    with pytest.raises(ValueError, match="epilogue"):
        lin(_x(4, 64, act), "cube")


@pytest.mark.parametrize("small_gemm", [True, False])
def test_a_prepacked_linear_takes_no_rows_on_either_path(small_gemm):
    """oneDNN's and our own path: a prefill chunk with no output row asks the LM head for nothing."""
    if not prepack.available():
        pytest.skip("no oneDNN in this torch")
    lin = torch.nn.Linear(64, 48, bias=False)
    ref = lin.weight.detach().clone()
    prepack.prepack_linears(lin, small_gemm=small_gemm)
    with torch.inference_mode():
        for m in ROWS:
            x = _x(m, 64)
            y = prepack.linear(lin, x)
            assert y.shape == (m, 48)
            if m:
                torch.testing.assert_close(y, x @ ref.T, rtol=1e-4, atol=1e-4)
        assert prepack.linear_silu(lin, _x(0, 64)).shape == (0, 48)
        assert prepack.linear_then(lin, _x(0, 64), _x(0, 48), "add").shape == (0, 48)
        with pytest.raises(ValueError, match="64 inputs"):
            prepack.linear(lin, _x(2, 65))
        with pytest.raises(ValueError, match="operand"):
            prepack.linear_then(lin, _x(2, 64), _x(2, 47), "add")


def _layout(rows: list[list[int]]) -> CellLayout:
    ptr = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    return CellLayout(ptr, torch.tensor([c for r in rows for c in r], dtype=torch.long))


def test_cell_attention_over_every_row_count_and_refused_layouts():
    impl = RowAttention(torch.device("cpu"), torch.float32)
    if impl.kernel is None:
        pytest.skip(impl.reason)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 2, 80, 16, generator=g), torch.randn(1, 2, 80, 16, generator=g)
    q = torch.randn(64, 4, 16, generator=g)
    rows = [list(range(r % 80 + 1)) for r in range(64)]
    whole = impl.rows(_layout(rows)).attend(q, k, v, 0.25)
    for m in ROWS:
        out = impl.rows(_layout(rows[:m])).attend(q[:m], k, v, 0.25)
        assert out.shape == (m, 4, 16) and torch.equal(out, whole[:m]), m
    with pytest.raises(ValueError, match="outside the cache"):
        impl.rows(_layout([[0, 80]])).attend(q[:1], k, v, 0.25)
    with pytest.raises(ValueError, match="3 rows for 2"):
        impl.rows(_layout([[0], [1], [2]])).attend(q[:2], k, v, 0.25)
    bad = CellLayout(torch.tensor([0, 5, 2]), torch.tensor([0, 1], dtype=torch.long))
    with pytest.raises(ValueError, match="row pointers"):
        impl.rows(bad).attend(q[:2], k, v, 0.25)
    with pytest.raises(ValueError, match="queries"):
        impl.rows(_layout([[0]])).attend(torch.randn(1, 3, 16), k, v, 0.25)  # 3 heads over 2 key heads


def test_the_head_steps_pieces_check_their_rows():
    assert head_rows(torch.zeros(0, 8), 8, "features") == 0
    with pytest.raises(ValueError, match=r"expected \[n, 8\]"):
        head_rows(torch.zeros(3, 7), 8, "features")
    with pytest.raises(ValueError, match=r"expected \[n, 8\]"):
        head_rows(torch.zeros(8), 8, "features")
