"""Prepacked oneDNN weights for the model's linear layers on the CPU: verification at the price of one row.

Speculation pays when verifying k+1 rows costs little more than one row. With torch's default CPU path (MKL
sgemm) it does not on some CPUs: MKL's small-M product makes 2 rows cost far more than 1. oneDNN with the weight
reordered once into its blocked layout (the call torch's own CPU inductor uses) keeps a forward of a few rows
at about one row's time (docs/engine.md has the figures).

For one row, MKL's matrix-vector product is still the faster one for the layers' small matrices, so a single
row of a narrow layer goes the default way; everything else (several rows, or a wide matrix like the LM head)
goes through the packed weight. The module stays an nn.Linear with its parameters: only its forward changes,
so state_dict, tied weights and hooks are untouched. Training (grad enabled) takes the default path.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

WIDE = 8192  # out_features from which one row is faster through oneDNN too (the LM head)
BATCH_HINT = 4  # rows the weight layout is tuned for: a verification batch of k + 1 ~ 4


def available() -> bool:
    """Whether this torch has the oneDNN linear ops (CPU builds with mkldnn)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // max(1, x.shape[-1])
    if torch.is_grad_enabled() or x.dtype != torch.float32 or (rows == 1 and self.out_features < WIDE):
        return F.linear(x, self.weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, self._packed_weight, self.bias, "none", [], "")


def prepack_linears(model: nn.Module) -> int:
    """Give every float32 CPU nn.Linear of `model` a packed copy of its weight; returns how many.

    Costs a second copy of the linear weights in memory (about 540 MB for a 135M-parameter model)."""
    if not available():
        return 0
    n = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, nn.Linear) or hasattr(module, "_packed_weight"):
                continue
            w = module.weight
            if w.device.type != "cpu" or w.dtype != torch.float32:
                continue
            module._packed_weight = torch.ops.mkldnn._reorder_linear_weight(w.detach(), BATCH_HINT)
            module.forward = types.MethodType(_packed_forward, module)
            n += 1
    return n
