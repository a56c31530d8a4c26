"""Prepacked oneDNN weights for the model's linear layers on the CPU: one copy, batch-invariant, fused epilogues.

Speculation pays when verifying k+1 rows costs little more than one row. With torch's default CPU path (MKL
sgemm, or the generic bfloat16 kernel) it does not on some CPUs. oneDNN with the weight reordered once into its
blocked layout (the call torch's own CPU inductor uses) keeps a forward of a few rows at about one row's time,
and is the faster one at one row too in both float32 and bfloat16 (docs/engine.md has the figures).

Two more reasons to send every row through the packed weight:
- one copy: the reordered weight replaces the original parameter, so the model's linears take their size once;
- batch invariance: a row gets bit-identical outputs whether it is computed alone or with 15 others, so a
  verification batch sees the very logits plain decoding sees, in bfloat16 as in float32.

The module stays an nn.Linear (hooks, names and the bias are untouched) whose forward uses the packed weight. A
weight tied to another module (an LM head sharing the embedding matrix) is kept for that module and packed as a
copy. The packed layout cannot be trained through or read back: a grad-enabled call raises.
"""

from __future__ import annotations

import types

import torch
from torch import nn

from engine.forward import gemm
from engine.forward.gemm import SmallGemm
from engine.forward.kernels import registry

BATCH_HINT = 4  # rows the weight layout is tuned for: a verification batch of k + 1 ~ 4
DTYPES = (torch.float32, torch.bfloat16)  # what oneDNN packs on the CPU


def available() -> bool:
    """Whether this torch has the oneDNN linear ops (CPU builds with mkldnn)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _rows3(x: torch.Tensor) -> torch.Tensor:
    """x as [1, T, in] with T >= 2.

    oneDNN's packed linear takes [1, T, in] at the speed of the blocked layout (a 2D [T, in] is slower on some
    shapes). A single row goes in twice: for one row oneDNN picks a matrix-vector kernel whose sums differ in
    the last bits from the batched kernel's (float32, 1536 inputs), and two rows cost what one does."""
    x = x.reshape(1, -1, x.shape[-1])
    return x.expand(1, 2, x.shape[-1]).contiguous() if x.shape[1] == 1 else x


def _unrows(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    n = x.numel() // x.shape[-1]
    return out[:, :n].reshape(*x.shape[:-1], out.shape[-1])


def _check(module: nn.Linear, x: torch.Tensor) -> torch.Tensor | None:
    """Raises for a call the packed layout cannot take; the output itself where there are no rows (a prefill
    chunk with no output row): neither oneDNN nor our kernels are asked to multiply nothing."""
    if torch.is_grad_enabled():
        raise RuntimeError("a prepacked linear is for inference only: load the model with prepack=False to train "
                           "through it")
    if x.shape[-1] != module.in_features:
        raise ValueError(f"a linear of {module.in_features} inputs given rows of {x.shape[-1]}")
    if x.numel() == 0:
        return x.new_empty(*x.shape[:-1], module.out_features)
    return None


def packed_linear(w, bias: torch.Tensor | None, x3: torch.Tensor, post: str = "none",
                  other3: torch.Tensor | None = None) -> torch.Tensor:
    """x3 [1, T, in] through a packed weight, ours (engine/forward/gemm.py) or oneDNN's; post "none" or "swish", or
    "add" / "mul" with other3 [1, T, out]. The lean forward calls it with the weights it fetched once."""
    if isinstance(w, SmallGemm):
        if bias is None:
            return w(x3, post, other3)
        # our kernels have no bias term: it is added to their sums, as lean_layers.c adds it (the same bits)
        y = w(x3) + bias
        if post == "swish":
            return torch.nn.functional.silu(y)
        if post == "add":
            return y + other3
        return y * other3 if post == "mul" else y
    if other3 is not None:
        return torch.ops.mkldnn._linear_pointwise.binary(x3, other3, w, bias, post)
    return torch.ops.mkldnn._linear_pointwise(x3, w, bias, post, [], "")


def linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """module(x) through the packed weight."""
    empty = _check(module, x)
    if empty is not None:
        return empty
    return _unrows(packed_linear(module._packed_weight, module.bias, _rows3(x)), x)


def linear_silu(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """silu(module(x)) in one call (oneDNN's eltwise post-op)."""
    empty = _check(module, x)
    if empty is not None:
        return empty
    return _unrows(packed_linear(module._packed_weight, module.bias, _rows3(x), "swish"), x)


def linear_then(module: nn.Linear, x: torch.Tensor, other: torch.Tensor, op: str) -> torch.Tensor:
    """module(x) `op` other, op "add" or "mul", in one call (oneDNN's binary post-op)."""
    empty = _check(module, x)
    if empty is not None:
        return empty
    if other.shape[:-1] != x.shape[:-1] or other.shape[-1] != module.out_features:
        raise ValueError(f"a linear's {op} operand of {tuple(other.shape)} for rows {tuple(x.shape)}")
    return _unrows(packed_linear(module._packed_weight, module.bias, _rows3(x), op, _rows3(other)), x)


def _packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(self, x)


def install(module: nn.Linear, packed, drop_weight: bool) -> None:
    """The module runs through `packed` (a SmallGemm or oneDNN's reordered weight) from now on; drop_weight: the
    packed layout is the one copy."""
    module._packed_weight = packed
    if drop_weight:
        del module.weight
    module.forward = types.MethodType(_packed_forward, module)


def is_packed(module: nn.Module) -> bool:
    return hasattr(module, "_packed_weight")


def linear_paths(model: nn.Module) -> str:
    """Which path the model's packed linears take, counted: "our float32 kernel 211" or "our bfloat16 kernel
    210, oneDNN 1" (the status line shows it: the kernels depend on the CPU), named as the kernel registry
    (engine/forward/kernels/registry.py) names them."""
    counts: dict[str, int] = {}
    for module in model.modules():
        w = getattr(module, "_packed_weight", None)
        if w is None:
            continue
        name = registry.linear_path(w.fn if isinstance(w, SmallGemm) else None)
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items())) or "not packed"


def _tied_elsewhere(model: nn.Module) -> set[int]:
    """ids of parameters owned by a module that is not a Linear (an embedding an LM head may share)."""
    owned = set()
    for module in model.modules():
        if not isinstance(module, nn.Linear):
            owned.update(id(p) for p in module.parameters(recurse=False))
    return owned


def prepack_linears(model: nn.Module, keep_weights: bool = False, small_gemm: bool = True,
                    store: torch.dtype | None = None) -> int:
    """Replace the weight of every float32 / bfloat16 CPU nn.Linear of `model` by its packed layout; how many.

    A weight shared with a non-linear module stays as it is and gets a packed copy beside it; so does every
    weight with keep_weights, for models whose own code reads their linears' weights (transformers' Mamba
    reads `out_proj.weight.dtype`): the lean forward's families do not, the others keep both.

    Weights go to our own kernels where one applies (engine/forward/gemm.py: bfloat16 with AVX512-BF16, float32 with
    AVX2; small_gemm=False keeps oneDNN): every row of every batch then goes through one of the two, never
    both, so batch invariance holds.

    store=torch.float16 keeps float32 weights as float16 where our float16-weight kernel takes them (float32
    inputs and sums): for a drafter whose weights are float16 values already, half the bytes to read."""
    if not available():
        return 0
    tied = _tied_elsewhere(model)
    kernels = gemm.load() if small_gemm else None
    n = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, nn.Linear) or is_packed(module):
                continue
            w = module.weight
            if w.device.type != "cpu" or w.dtype not in DTYPES:
                continue
            stored = SmallGemm.pack(kernels, w.to(store)) if store is not None else None
            install(module, stored or SmallGemm.pack(kernels, w)
                    or torch.ops.mkldnn._reorder_linear_weight(w.detach(), BATCH_HINT),
                    drop_weight=id(w) not in tied and not keep_weights)
            n += 1
    return n
