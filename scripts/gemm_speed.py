"""Our linear kernels (engine/forward/gemm.py) against oneDNN's packed layout on the embedded model's shapes.

Times the 210 layer linears of a forward (30 layers of q, k, v, o, gate, up, down, random weights cycling
through memory as in a real forward) at several row counts, fastest of 7 passes each, and checks that a row's
outputs are the same bits alone as in a batch.

    .venv/bin/python scripts/gemm_speed.py [--dtype bfloat16|float32] [--rows 1,2,4,6,8,12,16,24,32]

On a CPU with AVX512F the float32 kernel packs 16 outputs a block; `--dtype float32` also times the AVX2 layout
(8 outputs a block, built with -DBLOCK8) and checks that both give the same bits.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HIDDEN, MLP, LAYERS = 576, 1536, 30  # the embedded model (SmolLM2-135M)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,6,8,12,16,24,32")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    a = ap.parse_args(argv)

    import torch

    from engine.forward import gemm

    dtype = getattr(torch, a.dtype)
    kernels = gemm.load((dtype,))
    if kernels.get(dtype) is None:
        print(f"the {a.dtype} kernel does not run here: {kernels.why_not[dtype]}")
        return 1
    gen = torch.Generator().manual_seed(0)
    shapes = [(HIDDEN, HIDDEN), (HIDDEN, 192), (HIDDEN, 192), (HIDDEN, HIDDEN), (HIDDEN, MLP), (HIDDEN, MLP),
              (MLP, HIDDEN)] * LAYERS  # (in, out)
    weights = [torch.randn(n, k, generator=gen).to(dtype) for k, n in shapes]
    ours = [gemm.SmallGemm.pack(kernels, w, None) for w in weights]
    narrow = None
    if dtype == torch.float32 and kernels.fns[dtype][2] != 8:
        narrow_kernels = gemm.load((dtype,), defines=("BLOCK8",))
        narrow = [gemm.SmallGemm.pack(narrow_kernels, w, None) for w in weights]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 4) for w in weights]

    def timed(fn) -> float:
        fn()
        best = float("inf")
        for _ in range(7):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best * 1e3

    print(f"rows  ours ms  oneDNN ms{'  8-wide ms' if narrow else ''}")
    with torch.inference_mode():
        for m in [int(r) for r in a.rows.split(",")]:
            x = {k: torch.randn(1, max(m, 2), k, generator=gen).to(dtype) for k in (HIDDEN, MLP)}
            mine = timed(lambda: [lin(x[lin.k][:, :m]) for lin in ours])
            theirs = timed(lambda: [torch.ops.mkldnn._linear_pointwise(x[k], w, None, "none", [], "")
                                    for (k, _), w in zip(shapes, onednn)])
            other = ""
            if narrow:
                other = f"  {timed(lambda: [lin(x[lin.k][:, :m]) for lin in narrow]):10.2f}"
            print(f"{m:4d}  {mine:7.2f}  {theirs:9.2f}{other}")
        x = torch.randn(40, HIDDEN, generator=gen).to(dtype)
        same = all(torch.equal(ours[4](x[i:i + 1])[0], ours[4](x)[i]) for i in range(9))
        both = narrow is None or all(torch.equal(ours[j](x[:m, :ours[j].k]), narrow[j](x[:m, :ours[j].k]))
                                     for j in (0, 1, 4) for m in (1, 5, 9, 16, 40) if ours[j].k == HIDDEN)
    print(f"a row alone gives the bits it gets in a batch of 9: {same}")
    if narrow:
        print(f"the 16- and 8-wide layouts give the same bits: {both}")
    return 0 if same and both else 1


if __name__ == "__main__":
    sys.exit(main())
