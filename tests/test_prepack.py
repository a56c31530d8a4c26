"""Prepacked oneDNN linears: the same products as nn.Linear for any number of rows, training untouched, and the
loader packs CPU float32 models."""

import pytest
import torch
from torch import nn

from engine import prepack

pytestmark = pytest.mark.skipif(not prepack.available(), reason="this torch has no oneDNN linear ops")


@pytest.mark.parametrize("shape", [(1, 1, 96), (1, 2, 96), (1, 5, 96), (3, 7, 96), (4, 96)])
@pytest.mark.parametrize("out_features", [40, prepack.WIDE])
def test_packed_linear_gives_the_default_product(shape, out_features):
    torch.manual_seed(0)
    plain = nn.Linear(96, out_features, bias=True)
    packed = nn.Linear(96, out_features, bias=True)
    packed.load_state_dict(plain.state_dict())
    assert prepack.prepack_linears(packed) == 1
    x = torch.randn(*shape)
    with torch.inference_mode():
        want, got = plain(x), packed(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert set(packed.state_dict()) == {"weight", "bias"}  # nothing new is saved


def test_training_takes_the_default_path_and_gets_gradients():
    lin = nn.Linear(16, 8)
    prepack.prepack_linears(lin)
    x = torch.randn(3, 16, requires_grad=True)
    lin(x).sum().backward()
    assert lin.weight.grad is not None and x.grad is not None


def test_packing_twice_and_other_dtypes_are_left_alone():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).to(torch.float64))
    assert prepack.prepack_linears(model) == 1
    assert prepack.prepack_linears(model) == 0


def test_the_loader_packs_a_cpu_float32_model(tiny_target):
    linears = [m for m in tiny_target.model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(hasattr(m, "_packed_weight") for m in linears)
