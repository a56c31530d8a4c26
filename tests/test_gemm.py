"""Our kernels for few-row linears (engine/forward/gemm.py), bfloat16, float32 and float16 weights: right sums, the
same bits for a row in any batch, the fused epilogues, and oneDNN kept wherever a kernel does not apply."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.forward import gemm, prepack

KERNELS = gemm.load()
DTYPES = [pytest.param(dt, marks=pytest.mark.skipif(KERNELS.get(dt) is None,
                                                   reason=f"{dt} kernel not available here: {KERNELS.why_not.get(dt)}"))
          for dt in (torch.bfloat16, torch.float32, torch.float16)]
# one bfloat16 rounding of a float32 sum is within 2^-8 of it; float32 sums in another order within 1e-5 (float16
# weights are widened exactly and summed in float32)
TOL = {torch.bfloat16: dict(rtol=2 ** -7, atol=1e-2), torch.float32: dict(rtol=1e-5, atol=1e-5),
       torch.float16: dict(rtol=1e-5, atol=1e-5)}
ACT = {torch.float16: torch.float32}  # inputs and outputs of a kernel whose weights are of another dtype


def _weights(n: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sums_and_epilogues_match_float_arithmetic(dtype):
    w = _weights(96, 64, dtype)
    lin = gemm.SmallGemm.pack(KERNELS, w)
    g = torch.Generator().manual_seed(1)
    act = ACT.get(dtype, dtype)
    x = torch.randn(5, 64, generator=g).to(act)
    other = torch.randn(5, 96, generator=g).to(act)
    ref = x.double() @ w.double().T
    assert lin(x).dtype == act
    torch.testing.assert_close(lin(x).double(), ref, **TOL[dtype])
    torch.testing.assert_close(lin(x, "swish").double(), F.silu(ref), **TOL[dtype])
    torch.testing.assert_close(lin(x, "add", other).double(), ref + other.double(), **TOL[dtype])
    torch.testing.assert_close(lin(x, "mul", other).double(), ref * other.double(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_gets_the_same_bits_alone_and_in_any_batch(dtype):
    # float32 blocks hold 8 outputs (16 with AVX512F) and go in pairs up to half a pass's rows: 13 blocks leave
    # one without a pair
    block = KERNELS.get(dtype)[2]
    n = 96 if dtype == torch.bfloat16 else 13 * block
    w = _weights(n, 128, dtype, seed=2)
    lin = gemm.SmallGemm.pack(KERNELS, w)
    x = torch.randn(37, 128, generator=torch.Generator().manual_seed(3)).to(ACT.get(dtype, dtype))
    whole = lin(x)  # 37 rows: several passes over each block (16 rows a pass in bfloat16, 12 or 24 in float32)
    for m in (1, 2, 3, 4, 6, 7, 12, 13, 16, 17, 24, 25, 33):
        assert torch.equal(lin(x[:m]), whole[:m]), m
    assert torch.equal(lin(x[20:21]), whole[20:21])
    # a prompt's rows (32 and more in float32) take inputs in blocks (2048 / block) with partial sums kept between
    w = _weights(n, 600, dtype, seed=4)
    lin = gemm.SmallGemm.pack(KERNELS, w)
    x = torch.randn(70, 600, generator=torch.Generator().manual_seed(5)).to(ACT.get(dtype, dtype))
    other = torch.randn(70, n, generator=torch.Generator().manual_seed(6)).to(ACT.get(dtype, dtype))
    whole, added = lin(x), lin(x, "add", other)
    for m in (1, 5, 31, 32, 33, 70):
        assert torch.equal(lin(x[:m]), whole[:m]), m
        assert torch.equal(lin(x[:m], "add", other[:m]), added[:m]), m


@pytest.mark.skipif(KERNELS.get(torch.float32) is None or KERNELS.get(torch.float32)[2] == 8,
                    reason="no 16-wide float32 kernel here (no AVX512F)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_16_wide_float32_layout_gives_the_bits_of_the_8_wide_one(dtype):
    # each output is the same chain of fused multiply-adds over k in either layout: a model runs the same text
    # on an AVX2 and an AVX512 CPU
    narrow = gemm.load((dtype,), defines=("BLOCK8",))
    assert narrow.get(dtype)[2] == 8
    w = _weights(208, 600, dtype, seed=7)
    wide_lin, narrow_lin = gemm.SmallGemm.pack(KERNELS, w), gemm.SmallGemm.pack(narrow, w)
    x = torch.randn(40, 600, generator=torch.Generator().manual_seed(8))
    other = torch.randn(40, 208, generator=torch.Generator().manual_seed(9))
    for m in (1, 3, 8, 13, 24, 31, 40):
        assert torch.equal(wide_lin(x[:m]), narrow_lin(x[:m])), m
        assert torch.equal(wide_lin(x[:m], "swish"), narrow_lin(x[:m], "swish")), m
        assert torch.equal(wide_lin(x[:m], "mul", other[:m]), narrow_lin(x[:m], "mul", other[:m])), m


@pytest.mark.parametrize("dtype", DTYPES)
def test_prepacking_sends_linears_to_the_kernel_and_keeps_onednn_elsewhere(dtype):
    model = nn.Sequential(nn.Linear(64, 32, bias=False), nn.Linear(32, 32, bias=True), nn.Linear(32, 20, bias=False))
    act = ACT.get(dtype, dtype)  # float16 weights: a float32 model whose weights are stored in float16
    model = model.to(act).eval()
    x = torch.randn(3, 64).to(act)
    with torch.no_grad():
        before = model(x)
        assert prepack.prepack_linears(model, store=dtype if dtype in ACT else None) == 3
        after = model(x)
    kinds = [isinstance(m._packed_weight, gemm.SmallGemm) for m in model]
    assert kinds == [True, True, False]  # 20 outputs (not a block's multiple) stay with oneDNN; a bias is added
    assert prepack.linear_paths(model) == f"oneDNN 1, our {str(dtype).removeprefix('torch.')} kernel 2"
    torch.testing.assert_close(after.float(), before.float(), rtol=0.05, atol=0.05)
    plain = nn.Linear(64, 32, bias=False).to(act)
    assert prepack.prepack_linears(plain, small_gemm=False, store=dtype if dtype in ACT else None) == 1
    assert not isinstance(plain._packed_weight, gemm.SmallGemm)


def test_a_weight_goes_only_to_a_kernel_of_its_own_dtype():
    only_bf16 = gemm.Kernels(fns={torch.bfloat16: KERNELS.get(torch.bfloat16) or (None, None, 16)})
    assert gemm.SmallGemm.pack(only_bf16, torch.zeros(32, 32)) is None
    assert gemm.SmallGemm.pack(only_bf16, torch.zeros(32, 32, dtype=torch.float16)) is None
    assert gemm.SmallGemm.pack(None, torch.zeros(32, 32, dtype=torch.bfloat16)) is None
    assert gemm.SmallGemm.pack(KERNELS, torch.zeros(32, 32, dtype=torch.float64)) is None


def test_a_cpu_without_the_feature_gets_no_kernel_and_a_reason(monkeypatch):
    monkeypatch.setattr("engine.forward.kernels.build.cpu_flags", lambda: {"sse2"})
    none = gemm.load()
    assert none.get(torch.float32) is None and none.get(torch.bfloat16) is None and none.get(torch.float16) is None
    assert "AVX2" in none.why_not[torch.float32] and "AVX512_BF16" in none.why_not[torch.bfloat16]
    assert "F16C" in none.why_not[torch.float16]


@pytest.mark.skipif(KERNELS.get(torch.float32) is None, reason="no float32 kernel on this CPU")
def test_a_cache_that_cannot_be_written_still_gets_the_kernels(tmp_path, monkeypatch):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("SPECPLAY_CACHE", str(blocked))
    assert gemm.load((torch.float32,)).get(torch.float32) is not None
