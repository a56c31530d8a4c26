"""Our own linears for a few rows (engine/forward/kernels/small_gemm*.c): bfloat16 where the CPU has AVX512-BF16,
float32 where it has AVX2 and FMA, and float16 weights over float32 inputs where it also has F16C (the draft
head's, engine/draft/head/net.py).

A decoding or verification forward multiplies 1 to 16 rows by each weight matrix: the cost is reading the
weights, plus whatever each call spends around that. oneDNN's packed linear (engine/forward/prepack.py) spends a
fixed time on every call at these sizes, the embedded model makes 211 calls a forward, and at a few rows it reads
the weights at well under the memory's speed. Both kernels stream each packed weight once per call and keep one
accumulator per (row, output) that runs over the inputs in a fixed order, so a row gets the same bits alone or
in a batch.

- bfloat16 (`small_gemm.c`, vdpbf16ps, 16 rows per pass). On the embedded model's 210 layer linears it is
  faster than oneDNN at a few rows and as fast from 12 rows on, where both are bound by the multiplications
  (`scripts/gemm_speed.py`; docs/history.md#the-kernels).
- float32 (`small_gemm_f32.c`, vfmadd231ps, up to 12 rows a pass over a block of 8 outputs, two blocks at a
  time up to 6 rows, weights prefetched 16 KB ahead; 16 outputs and 24 rows with AVX512F). On AVX2 this layout
  beat the one it replaced (3 rows a pass over blocks of 32 outputs) at 4 to 12 rows and matched it at 1 and
  16, and oneDNN was slower than either at 1 to 8 rows (`scripts/gemm_speed.py --dtype float32`). With AVX512F
  the blocks hold 16 outputs (zmm) and a pass 24 rows: the broadcast loads that bound the 8-wide passes feed
  twice the sums, so the 16-wide passes gain the more rows they hold, and the embedded model's whole forward at
  16 and 24 rows costs far fewer single-row forwards: the tree verifications the round's budget buys
  (docs/history.md#the-kernels).

`SmallGemm.pack` returns None where no kernel applies (no such CPU feature, no C compiler, another dtype, a width
the kernel's blocks do not divide): the caller keeps oneDNN for that weight. A bias stays the module's:
prepack.packed_linear adds it to the kernel's sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.forward.kernels import registry

POST = {"none": 0, "swish": 1, "add": 2, "mul": 3}  # the kernels' epilogues, by oneDNN's names


@dataclass(frozen=True)
class _Spec:
    library: str  # its entry in engine/forward/kernels/registry.py: sources, CPU flags, signatures
    symbol: str  # the multiply; "<symbol>_pack" packs, "<symbol>_block" (where the library has it) says N's step
    n_block: int  # outputs per packed block where the library has no "<symbol>_block": N must be a multiple
    k_pair: int  # inputs packed together: K must be a multiple
    act: torch.dtype | None = None  # dtype of the inputs and outputs (the weights' if None)


# float16 weights with float32 inputs, sums and outputs: for a drafter trained and stored in float16 (the draft
# head), whose every step reads all its weights for a few rows: half the bytes, and no value it did not have
SPECS = {torch.bfloat16: _Spec("small_gemm", "small_gemm", 16, 2),
         torch.float32: _Spec("small_gemm_f32", "small_gemm_f32", 8, 1),
         torch.float16: _Spec("small_gemm_f16w", "small_gemm_f16w", 8, 1, torch.float32)}


@dataclass
class Kernels:
    """The kernels built for this host, by weight dtype, and why the others are not."""

    fns: dict = field(default_factory=dict)  # dtype -> (multiply, pack, outputs per block) from the built library
    why_not: dict = field(default_factory=dict)  # dtype -> one line

    def get(self, dtype: torch.dtype):
        return self.fns.get(dtype)


def load(dtypes=(torch.bfloat16, torch.float32, torch.float16), defines: tuple[str, ...] = ()) -> Kernels:
    """Build (once per host, engine/forward/kernels/registry.py) and load the kernels of these dtypes that this CPU
    runs; `defines` are added to every build (`("BLOCK8",)`: the float32 kernel's AVX2 layout on an AVX512 CPU)."""
    out = Kernels()
    for dtype in dtypes:
        spec = SPECS[dtype]
        lib, where = registry.load(spec.library, defines)
        if lib is None:
            out.why_not[dtype] = where
            continue
        block = getattr(lib, spec.symbol + "_block", None)
        out.fns[dtype] = (getattr(lib, spec.symbol), getattr(lib, spec.symbol + "_pack"),
                          block() if block is not None else spec.n_block)
    return out


@dataclass
class SmallGemm:
    """One packed weight [N, K] and the kernel that multiplies by it; call it like the linear it replaces."""

    fn: object  # the multiply from the built library
    weight: torch.Tensor  # [N * K] in the kernel's blocked layout
    k: int  # inputs
    n: int  # outputs
    dtype: torch.dtype  # of the weight's values
    act: torch.dtype  # of the inputs and the outputs
    # how the weight is stored where not as `dtype`: GGUF blocks read as float32 ("q4_1", "q8_0") or multiplied
    # by 8-bit inputs in integers ("q4_1_dot", "q8_0_dot"), engine/forward/quant.py
    kind: str = ""

    @property
    def label(self) -> str:
        return self.kind or str(self.dtype).removeprefix("torch.")

    def outputs(self, start: int, stop: int) -> "SmallGemm | None":
        """The outputs [start, stop) as a weight of their own, sharing this one's memory (Phi-3's q, k, v in one
        linear): every layout here stores blocks of NB (8 or 16) outputs one after another, each of the same size,
        so whole blocks are a contiguous slice. None where a bound is not on a block of 16."""
        if start % 16 or stop % 16 or not 0 <= start < stop <= self.n or self.weight.numel() % self.n:
            return None
        per = self.weight.numel() // self.n
        return SmallGemm(self.fn, self.weight[start * per:stop * per], self.k, stop - start, self.dtype, self.act,
                         self.kind)

    @classmethod
    def pack(cls, kernels: Kernels | None, w: torch.Tensor) -> "SmallGemm | None":
        n, k = w.shape
        spec = SPECS.get(w.dtype)
        fns = kernels.get(w.dtype) if kernels is not None else None
        if fns is None or spec is None:
            return None
        fn, pack, n_block = fns
        if n % n_block or k % spec.k_pair:
            return None
        src = w.detach().contiguous()
        packed = torch.empty(n * k, dtype=w.dtype, device="cpu")
        pack(src.data_ptr(), packed.data_ptr(), k, n)
        return cls(fn, packed, k, n, w.dtype, spec.act or w.dtype)

    def __call__(self, x: torch.Tensor, post: str = "none", other: torch.Tensor | None = None) -> torch.Tensor:
        """x [..., K] -> [..., N]; post "swish", or "add" / "mul" with other [..., N].

        The C kernels take what this checks and nothing else: a width or an epilogue operand of another shape
        would read past its buffer, and no rows at all (a prefill chunk with no output row) is answered here."""
        if x.shape[-1] != self.k:
            raise ValueError(f"{self.label} kernel: inputs of width {x.shape[-1]}, the weight takes {self.k}")
        if post not in POST or (other is None) != (post in ("none", "swish")):
            raise ValueError(f"{self.label} kernel: epilogue {post!r} with{'out' if other is None else ''} an operand")
        x2 = x.reshape(-1, self.k).to(self.act).contiguous()
        m = x2.shape[0]
        y = torch.empty(m, self.n, dtype=self.act, device="cpu")
        o = None
        if other is not None:
            if other.numel() != m * self.n:
                raise ValueError(f"{self.label} kernel: an operand of {tuple(other.shape)} for {m} x {self.n} "
                                 "outputs")
            o = other.reshape(-1, self.n).to(self.act).contiguous()
        if m == 0:
            return y.reshape(*x.shape[:-1], self.n)
        if self.fn(x2.data_ptr(), self.weight.data_ptr(), y.data_ptr(), None if o is None else o.data_ptr(), m,
                   self.k, self.n, POST[post]):
            raise MemoryError(f"{self.label} kernel: no memory for its quantised rows")
        return y.reshape(*x.shape[:-1], self.n)
