"""Our bfloat16 kernel for few-row linears (engine/gemm.py): right sums, the same bits for a row in any batch,
the fused epilogues, and oneDNN kept wherever the kernel does not apply."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import gemm, prepack

KERNEL, WHY = gemm.load()
needs_kernel = pytest.mark.skipif(KERNEL is None, reason=f"small_gemm kernel not available here: {WHY}")


def _weights(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) / k ** 0.5).to(torch.bfloat16)


@needs_kernel
def test_sums_and_epilogues_match_float_arithmetic():
    w = _weights(96, 64)
    lin = gemm.SmallGemm.pack(KERNEL, w, None)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    other = torch.randn(5, 96, generator=g).to(torch.bfloat16)
    ref = x.float() @ w.float().T
    assert lin(x).dtype == torch.bfloat16
    # one bfloat16 rounding of a float32 sum: within 2^-8 of the exact value
    torch.testing.assert_close(lin(x).float(), ref, rtol=2 ** -7, atol=1e-3)
    torch.testing.assert_close(lin(x, "swish").float(), F.silu(ref), rtol=2 ** -7, atol=1e-3)
    torch.testing.assert_close(lin(x, "add", other).float(), ref + other.float(), rtol=2 ** -7, atol=1e-2)
    torch.testing.assert_close(lin(x, "mul", other).float(), ref * other.float(), rtol=2 ** -7, atol=1e-2)


@needs_kernel
def test_a_row_gets_the_same_bits_alone_and_in_any_batch():
    w = _weights(48, 128, seed=2)
    lin = gemm.SmallGemm.pack(KERNEL, w, None)
    x = torch.randn(37, 128, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    whole = lin(x)  # 37 rows: two full passes of 16 and a tail of 5
    for m in (1, 2, 4, 7, 16, 17, 33):
        assert torch.equal(lin(x[:m]), whole[:m]), m
    assert torch.equal(lin(x[20:21]), whole[20:21])


@needs_kernel
def test_prepacking_sends_bfloat16_linears_to_the_kernel_and_keeps_onednn_elsewhere():
    model = nn.Sequential(nn.Linear(64, 32, bias=False), nn.Linear(32, 32, bias=True), nn.Linear(32, 24, bias=False))
    model = model.to(torch.bfloat16).eval()
    x = torch.randn(3, 64).to(torch.bfloat16)
    with torch.no_grad():
        before = model(x)
        assert prepack.prepack_linears(model) == 3
        after = model(x)
    kinds = [isinstance(m._packed_weight, gemm.SmallGemm) for m in model]
    assert kinds == [True, False, False]  # a bias, and 24 outputs (not a multiple of 16), stay with oneDNN
    torch.testing.assert_close(after.float(), before.float(), rtol=0.05, atol=0.05)
    plain = nn.Linear(64, 32, bias=False).to(torch.bfloat16)
    assert prepack.prepack_linears(plain, small_gemm=False) == 1
    assert not isinstance(plain._packed_weight, gemm.SmallGemm)


def test_float32_weights_never_go_to_the_kernel():
    assert gemm.SmallGemm.pack(KERNEL, torch.zeros(32, 32), None) is None
    assert gemm.SmallGemm.pack(None, torch.zeros(32, 32, dtype=torch.bfloat16), None) is None
