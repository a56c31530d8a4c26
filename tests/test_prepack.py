"""Prepacked oneDNN linears: the same products as nn.Linear, bit-identical rows whatever the batch, one copy of
the weights, no silent training through them, and the loader packs CPU models in both dtypes."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.forward import prepack

pytestmark = pytest.mark.skipif(not prepack.available(), reason="this torch has no oneDNN linear ops")
DTYPES = [torch.float32] + ([torch.bfloat16] if torch.ops.mkldnn._is_mkldnn_bf16_supported() else [])
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _pair(n_in: int, n_out: int, dtype, bias=True):
    torch.manual_seed(0)
    plain = nn.Linear(n_in, n_out, bias=bias).to(dtype)
    packed = nn.Linear(n_in, n_out, bias=bias).to(dtype)
    packed.load_state_dict(plain.state_dict())
    assert prepack.prepack_linears(packed) == 1
    return plain, packed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 96), (1, 2, 96), (1, 5, 96), (3, 7, 96), (4, 96), (96,)])
@pytest.mark.parametrize("out_features", [40, 8192])
def test_packed_linear_gives_the_default_product(dtype, shape, out_features):
    plain, packed = _pair(96, out_features, dtype)
    x = torch.randn(*shape).to(dtype)
    with torch.inference_mode():
        want, got = plain(x), packed(x)
    assert got.shape == want.shape and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_row_is_bit_identical_alone_and_in_any_batch(dtype):
    """What makes a verification batch see the very logits plain decoding sees, in any dtype."""
    _, packed = _pair(576, 1536, dtype, bias=False)
    x = torch.randn(1, 32, 576).to(dtype)
    other = torch.randn(1, 32, 1536).to(dtype)
    with torch.inference_mode():
        full = [packed(x), prepack.linear_silu(packed, x), prepack.linear_then(packed, x, other, "add"),
                prepack.linear_then(packed, x, other, "mul")]
        for m in (1, 2, 3, 4, 5, 8, 13, 16, 31):
            part = [packed(x[:, :m]), prepack.linear_silu(packed, x[:, :m]),
                    prepack.linear_then(packed, x[:, :m], other[:, :m], "add"),
                    prepack.linear_then(packed, x[:, :m], other[:, :m], "mul")]
            for a, b in zip(part, full):
                assert torch.equal(a, b[:, :m]), f"{m} rows differ from the same rows in a batch of 32"


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_epilogues_match_the_composite_ops(dtype):
    plain, packed = _pair(64, 48, dtype)
    x, other = torch.randn(5, 64).to(dtype), torch.randn(5, 48).to(dtype)
    tol = dict(rtol=TOL[dtype], atol=TOL[dtype])
    with torch.inference_mode():
        y = plain(x).float()
        torch.testing.assert_close(prepack.linear_silu(packed, x).float(), F.silu(y), **tol)
        torch.testing.assert_close(prepack.linear_then(packed, x, other, "add").float(), y + other.float(), **tol)
        torch.testing.assert_close(prepack.linear_then(packed, x, other, "mul").float(), y * other.float(), **tol)


def test_the_packed_weight_replaces_the_original():
    model = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 256))
    assert prepack.prepack_linears(model) == 2
    assert [name for name, _ in model.named_parameters()] == ["0.bias", "1.bias"]  # the weights live packed only
    with pytest.raises(AttributeError):
        model[0].weight


def test_a_weight_tied_to_an_embedding_is_kept_for_it_and_packed_as_a_copy():
    emb = nn.Embedding(100, 32)
    head = nn.Linear(32, 100, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "head": head})
    assert prepack.prepack_linears(model) == 1
    assert emb.weight is head.weight  # the embedding still reads its rows
    ids = torch.tensor([3, 7])
    with torch.inference_mode():
        torch.testing.assert_close(head(emb(ids)), emb(ids) @ emb.weight.T, rtol=1e-4, atol=1e-4)


def test_training_through_a_packed_linear_is_refused_with_a_reason():
    lin = nn.Linear(16, 8)
    prepack.prepack_linears(lin)
    with pytest.raises(RuntimeError, match="inference only"):
        lin(torch.randn(3, 16, requires_grad=True))


def test_packing_twice_and_other_dtypes_are_left_alone():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).to(torch.float64))
    assert prepack.prepack_linears(model) == 1
    assert prepack.prepack_linears(model) == 0


def test_the_loader_packs_a_cpu_model_and_can_leave_it_stock(tiny_target, tmp_path):
    linears = [m for m in tiny_target.model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(prepack.is_packed(m) for m in linears)
    from engine.load.models import load_model

    stock = load_model(tiny_target.name, device="cpu", prepack=False)
    assert not any(prepack.is_packed(m) for m in stock.model.modules())
