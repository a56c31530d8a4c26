"""The weights' dtype, chosen by measurement: bfloat16 where this CPU computes it natively and it is faster.

A decode step of a small model streams every weight once, so its time is mostly memory traffic: bfloat16 halves
it, and on a CPU with native bfloat16 dot products (AVX-512 `avx512_bf16`, or AMX) the arithmetic keeps up.
Without them oneDNN emulates bfloat16 and it can be slower than float32. "auto" times the engine's own forward of a
model of the same config (every layer, weights zero, no values read from disk) in both dtypes, at one row and at a
verification batch of four, and keeps the faster; an explicit dtype is taken as asked. The whole forward, not the
linears alone: the lean forward runs float32 layers as one C call each and bfloat16 layers through torch
(engine/forward/lean.py). On an Intel CPU with AVX512-BF16 a layer's linears alone were faster in bfloat16 while
the embedded model's whole forwards were faster in float32
(docs/history.md#the-forwards-layers-precision-and-packed-weights). Where the config cannot be built
(a model of remote code) or its float32 weights would take over 2 GiB, one layer's linears are timed instead.

A GGUF whose Q4_1 / Q4_0 / Q5_0 / Q8_0 blocks are its weights exactly (engine/forward/quant.py) is read from its blocks, in one of
two arithmetics: "float32" widens each weight to the float32 value the loader made of it (the float32 model's
bits), "int8" rounds each row's inputs to 8 bits per group of 32 and sums the products in integers on VNNI or
in AVX2's byte pairs (llama.cpp's CPU arithmetic: different bits, fewer instructions for a verification batch). "auto"
takes int8 where a layer's linears at 1, 4 and 16 rows run faster in it.

Plain and speculative decoding run on the same loaded model, so they always share the dtype and the lossless
check compares like with like.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.forward.kernels import registry
from engine.forward.kernels.build import cpu_flags

CHOICES = ("auto", "float32", "bfloat16", "int8")
NATIVE_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of CPUs that compute bfloat16 natively
MARGIN = 0.95  # bfloat16 is kept when its layer time is below this fraction of float32's
# a model of the config is built to time its forward only up to this size in float32 (the loaded model, both
# timing copies and their packed weights share the memory); a larger one has one layer's linears timed
WHOLE_FORWARD_MAX_BYTES = 2 << 30


@dataclass
class DtypeChoice:
    # "float32" or "bfloat16": what the weights are loaded in; "int8": float32, the GGUF's blocks multiplied by
    # 8-bit inputs (engine/forward/kernels/small_gemm_qdot.c)
    dtype: str
    reason: str  # one line for the status bar, the Benchmark tab and traces.csv
    layer_ms: dict[str, float] = field(default_factory=dict)  # measured time by dtype (of a forward, see _timings)

    @property
    def torch_name(self) -> str:
        """The torch dtype the weights load in."""
        return "float32" if self.dtype == "int8" else self.dtype


def native_bf16_flag() -> str | None:
    """The flag by which this CPU computes bfloat16 natively, if it has one."""
    flags = cpu_flags()
    return next((f for f in NATIVE_FLAGS if f in flags), None)


TIMING_ROUNDS = 3  # timings of each arithmetic, interleaved, behind every `auto` choice


def _layer_shapes(config) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's linears: q, k, v, o, gate, up, down."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    d = int(cfg.hidden_size)
    heads = int(getattr(cfg, "num_attention_heads", 0) or max(1, d // 64))
    head_dim = int(getattr(cfg, "head_dim", None) or d // heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads) * head_dim
    inter = int(getattr(cfg, "intermediate_size", None) or 4 * d)
    return [(heads * head_dim, d), (kv, d), (kv, d), (d, heads * head_dim), (inter, d), (inter, d), (d, inter)]


def time_layer(config, dtype: str, copies: int = 4, reps: int = 7) -> float:
    """Fastest of `reps` timings, in ms, of one layer's linears at 1 row plus at 4 rows, weights cycling over
    `copies` layers; the fastest, since another busy process only ever adds time."""
    import torch

    from engine.forward import prepack

    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    layers = [[torch.nn.Linear(i, o, bias=False, dtype=torch_dtype) for o, i in _layer_shapes(config)]
              for _ in range(copies)]
    with torch.no_grad():
        for layer in layers:
            for lin in layer:
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen))
    model = torch.nn.ModuleList([torch.nn.ModuleList(layer) for layer in layers])
    prepack.prepack_linears(model)
    inputs = {lin.in_features: [torch.randn(1, rows, lin.in_features, generator=gen).to(torch_dtype)
                                for rows in (1, 4)] for layer in layers for lin in layer}
    times = []
    with torch.inference_mode():
        for _ in range(reps + 1):  # the first pass warms oneDNN's kernel cache
            t0 = time.perf_counter()
            for layer in layers:
                for lin in layer:
                    for x in inputs[lin.in_features]:
                        lin(x)
            times.append((time.perf_counter() - t0) / copies * 1000)
    return min(times[1:])


def time_forward(config, dtype: str, reps: int = 5) -> float:
    """Fastest of `reps` timings, in ms, of the engine's forward (engine/memory/context.py, prepacked as a loaded model
    is) at 1 row plus at 4 rows after a 16-token prompt, on a model of `config` whose weights are all zero: a
    dense kernel takes as long on any values, and zeros cost a memset where random ones are slow to draw."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from engine.batch import Batch
    from engine.memory.context import ModelContext
    from engine.forward.lean import family_reason
    from engine.forward.prepack import prepack_linears

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.eval()
    prepack_linears(model, keep_weights=family_reason(model) is not None)
    ctx = ModelContext(model, n_ctx=32)

    def forward(pos: list[int]) -> None:
        batch = Batch()
        for p in pos:
            batch.add(1, p, 0, True)
        ctx.decode(batch)

    forward(list(range(16)))
    times = []
    for _ in range(reps + 1):  # the first pass warms oneDNN's kernel cache
        t0 = time.perf_counter()
        forward([16])
        ctx.seq_rm(0, 16, -1)
        forward([16, 17, 18, 19])
        ctx.seq_rm(0, 16, -1)
        times.append((time.perf_counter() - t0) * 1000)
    return min(times[1:])


def float32_bytes(config) -> int:
    """About what the config's weights take in float32: its layers' linears and its embedding (twice untied)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    per_layer = sum(o * i for o, i in _layer_shapes(config))
    table = int(getattr(cfg, "vocab_size", 0) or 0) * int(cfg.hidden_size)
    tables = 1 if getattr(config, "tie_word_embeddings", False) else 2
    return 4 * (int(getattr(cfg, "num_hidden_layers", 1) or 1) * per_layer + tables * table)


def _timings(config) -> tuple[dict[str, float], str]:
    """ms by dtype and what was timed: the whole forward where the config builds and is small enough, else one
    layer's linears."""
    try:
        if float32_bytes(config) <= WHOLE_FORWARD_MAX_BYTES:
            return interleaved(lambda dt: time_forward(config, dt), ("float32", "bfloat16")), "a forward"
    except (ValueError, KeyError, TypeError, AttributeError, ImportError, RuntimeError):
        pass
    return interleaved(lambda dt: time_layer(config, dt), ("float32", "bfloat16")), "a layer's linears"


def interleaved(time_one, names: tuple[str, ...], rounds: int = TIMING_ROUNDS) -> dict[str, float]:
    """The fastest of `rounds` timings of each name, taken in turn (A B, B A, A B, ...): another busy process
    then slows some timings of both instead of every timing of one, and a busy second cannot decide."""
    best = {name: float("inf") for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            best[name] = min(best[name], time_one(name))
    return best


def choose_dtype(requested: str, config, device: str, blocks: str = "") -> DtypeChoice:
    """Resolve --dtype for a model of `config` on `device`. blocks: the GGUF quantisations our float32 path reads
    as stored ("Q4_1, Q8_0", engine/forward/quant.py), where the source has them: fewer bytes than bfloat16 reads."""
    if requested not in CHOICES:
        raise ValueError(f"dtype must be one of {', '.join(CHOICES)}, not {requested!r}")
    if requested == "int8" or (requested == "auto" and blocks and device == "cpu"):
        return _blocks_choice(requested, config, device, blocks)
    if requested != "auto":
        if requested == "bfloat16" and device == "cpu" and native_bf16_flag() is None:
            return DtypeChoice(requested, "bfloat16 as asked (this CPU has no native bfloat16: emulated, slower)")
        return DtypeChoice(requested, f"{requested} as asked")
    if device != "cpu":
        import torch

        if device.startswith("cuda") and torch.cuda.is_bf16_supported():
            return DtypeChoice("bfloat16", "auto: a GPU with bfloat16")
        return DtypeChoice("float32", f"auto: float32 on {device}")
    flag = native_bf16_flag()
    if flag is None:
        return DtypeChoice("float32", "auto: float32 (no native bfloat16 on this CPU)")
    ms, what = _timings(config)
    ratio = ms["bfloat16"] / ms["float32"]
    timing = f"{what} {ms['bfloat16']:.2f} ms in bfloat16, {ms['float32']:.2f} ms in float32"
    if ratio < MARGIN:
        return DtypeChoice("bfloat16", f"auto: bfloat16 ({flag}; {timing})", ms)
    return DtypeChoice("float32", f"auto: float32 (bfloat16 not faster here: {timing})", ms)


def _blocks_choice(requested: str, config, device: str, blocks: str) -> DtypeChoice:
    """"int8" asked, or "auto" for a GGUF with blocks: the integer kernel where it runs (and, for auto, is
    faster), else float32 widening the blocks."""
    from engine.forward.quant_dot import dot_reason, time_kernels

    exact = f"float32 (its {blocks} blocks read as stored)" if blocks else "float32"
    why = ("no GGUF with Q4_1 / Q4_0 / Q5_0 / Q8_0 blocks" if not blocks else f"on {device}" if device != "cpu"
           else dot_reason())
    if why:
        needs = ", ".join(f.upper() for f in registry.LIBRARIES["small_gemm_q"].cpu_flags)
        return DtypeChoice("float32", f"{requested}: {exact}; int8 needs {needs} and a GGUF's blocks ({why})")
    if requested == "int8":
        return DtypeChoice("int8", f"int8 as asked (its {blocks} blocks times 8-bit inputs)")
    ms = time_kernels(_layer_shapes(config))
    timing = f"a layer's linears at 1, 4, 16 rows {ms['q4_1_dot']:.2f} ms in int8, {ms['q4_1']:.2f} in float32"
    if ms["q4_1_dot"] < MARGIN * ms["q4_1"]:
        return DtypeChoice("int8", f"auto: int8 (its {blocks} blocks times 8-bit inputs; {timing})",
                           {"int8": ms["q4_1_dot"], "float32": ms["q4_1"]})
    return DtypeChoice("float32", f"auto: {exact} (int8 not faster here: {timing})",
                       {"int8": ms["q4_1_dot"], "float32": ms["q4_1"]})
