"""bfloat16 linears for a few rows through our own kernel (engine/kernels/small_gemm.c), where the CPU has
AVX512-BF16.

A decoding or verification forward multiplies 1 to 16 rows by each weight matrix: the cost is reading the
weights, plus whatever each call spends around that. oneDNN's packed linear (engine/prepack.py) spends about
20 us a call at these sizes; the embedded model makes 211 calls a forward. The kernel streams each packed weight
once per 16 rows with vdpbf16ps and a fixed order of additions, so a row gets the same bits alone or in a
batch. Measured on the embedded model's 210 layer linears (AMD EPYC, 2 cores, `scripts/gemm_speed.py`): 1 row
7.1 ms against oneDNN's 13.8, 4 rows 7.3 against 11.5, 8 rows 11.3 against 13.3, and the same from 12 rows
on, where both are bound by the multiplications.

`SmallGemm.pack` returns None where the kernel does not apply (no AVX512-BF16, no C compiler, another dtype,
a bias, a width that is not a multiple of 16): the caller keeps oneDNN for that weight.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

POST = {"none": 0, "swish": 1, "add": 2, "mul": 3}  # the kernel's epilogues, by oneDNN's names


def load():
    """(the kernel's two functions, None) or (None, why not)."""
    from engine.kernels.build import build, cpu_flags

    if "avx512_bf16" not in cpu_flags():
        return None, "the CPU has no AVX512-BF16"
    lib, where = build("small_gemm")
    if lib is None:
        return None, where
    fn, pack = lib.small_gemm, lib.small_gemm_pack
    fn.restype, pack.restype = None, None
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    pack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    return (fn, pack), None


@dataclass
class SmallGemm:
    """One packed weight [N, K] and the kernel that multiplies by it; call it like the linear it replaces."""

    fn: object  # small_gemm from the built library
    weight: torch.Tensor  # [N * K] bfloat16 in the kernel's layout [N/16][K/2][16][2]
    k: int  # inputs
    n: int  # outputs

    @classmethod
    def pack(cls, kernel, w: torch.Tensor, bias: torch.Tensor | None) -> "SmallGemm | None":
        n, k = w.shape
        if kernel is None or w.dtype != torch.bfloat16 or bias is not None or n % 16 or k % 2:
            return None
        fn, pack = kernel
        src = w.detach().contiguous()
        packed = torch.empty(n * k, dtype=torch.bfloat16)
        pack(src.data_ptr(), packed.data_ptr(), k, n)
        return cls(fn, packed, k, n)

    def __call__(self, x: torch.Tensor, post: str = "none", other: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] -> [..., N] bfloat16; post "swish", or "add" / "mul" with other [..., N]."""
        x2 = x.reshape(-1, self.k).to(torch.bfloat16).contiguous()
        m = x2.shape[0]
        y = torch.empty(m, self.n, dtype=torch.bfloat16)
        o = None
        if other is not None:
            o = other.reshape(-1, self.n).to(torch.bfloat16).contiguous()
        self.fn(x2.data_ptr(), self.weight.data_ptr(), y.data_ptr(), None if o is None else o.data_ptr(), m,
                self.k, self.n, POST[post])
        return y.reshape(*x.shape[:-1], self.n)
