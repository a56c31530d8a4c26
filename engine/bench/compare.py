"""Other implementations beside ours, on the same prompt ids: `--compare hf,llama.cpp`.

* `hf`: transformers' own `generate` on a stock float32 copy of the target (no packed weights, its own forward,
  as a user would run it): plain greedy ("hf-generate") and prompt lookup decoding ("hf-prompt-lookup",
  transformers' n-gram speculation, `prompt_lookup_num_tokens=10`). float32 whatever our engine's dtype, so
  the ratio against it is the whole gain of this engine over transformers as shipped.
* `llama.cpp`: the same GGUF file through llama-cpp-python, plain greedy (engine/bench/llamacpp.py); only for
  a target loaded from a .gguf ("embedded" is one).

Their tokens are not ours (another dtype, another kernel, or Q4_1 weights unquantised differently), so their
lossless_ok is "n/a"; `match_plain` says how many leading tokens agree with our plain decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine.bench.run import BenchConfig, RunResult, prompt_ids

KINDS = ("hf", "llama.cpp")
ROWS = {"hf": ("hf-generate", "hf-prompt-lookup"), "llama.cpp": ("llama.cpp",)}


def parse_compare(text: str | None, target: str) -> list[str]:
    """The --compare list, checked before any model loads."""
    from engine.load.models import EMBEDDED_Q8
    from engine.load.packaged import packaged_names

    kinds = [k.strip() for k in (text or "").split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"--compare takes {', '.join(KINDS)} (comma-separated), not {bad[0]!r}")
    gguf_names = (*packaged_names(), EMBEDDED_Q8)
    if "llama.cpp" in kinds and target not in gguf_names and not target.endswith(".gguf"):
        raise ValueError(f"--compare llama.cpp needs a .gguf target (or one of {', '.join(gguf_names)})")
    return kinds


@dataclass
class Comparators:
    hf_model: object | None = None  # a stock float32 LoadedModel of the target, for transformers' generate
    llama: object | None = None  # an engine.bench.llamacpp.LlamaCppRunner

    @classmethod
    def load(cls, kinds: list[str], cfg: BenchConfig, n_ctx: int) -> "Comparators":
        """Load what `kinds` ask for (slow); raises ValueError / RuntimeError with the reason."""
        out = cls()
        if "hf" in kinds:
            from engine.load.models import load_model

            out.hf_model = load_model(cfg.target, device=cfg.device, trust_remote_code=cfg.trust_remote_code,
                                      dtype="float32", prepack=False)
        if "llama.cpp" in kinds:
            from engine.bench import llamacpp
            from engine.load.models import gguf_source

            path = gguf_source(cfg.target)
            # --threads holds for llama.cpp too: a yardstick on more threads than ours is not the same race
            out.llama = llamacpp.open_model(path, n_ctx=n_ctx, n_threads=cfg.threads)
        return out

    def kinds(self) -> list[str]:
        return [k for k, on in (("hf-generate", self.hf_model), ("hf-prompt-lookup", self.hf_model),
                                ("llama.cpp", self.llama)) if on is not None]

    def run(self, kind: str, cfg: BenchConfig, engine, p: dict, reference: RunResult) -> RunResult:
        ids = prompt_ids(engine, p, cfg.ctx_len)
        if kind == "llama.cpp":
            eos = engine.target.eos_ids()
            toks, seconds = self.llama.generate(ids, cfg.max_new_tokens, eos, ignore_eos=cfg.ignore_eos)
        else:
            toks, seconds = _hf_generate(self.hf_model, ids, cfg, kind == "hf-prompt-lookup")
        res = RunResult(tokens=toks, seconds=seconds, spec_on=kind == "hf-prompt-lookup", rollback_mode=kind)
        res.lossless_ok = "n/a"
        res.match_plain = _common_prefix(toks, reference.tokens)
        return res


def _hf_generate(lm, ids: list[int], cfg: BenchConfig, lookup: bool) -> tuple[list[int], float]:
    import torch

    x = torch.tensor([ids], device=lm.device)
    kwargs = dict(max_new_tokens=cfg.max_new_tokens, attention_mask=torch.ones_like(x))
    if cfg.ignore_eos:
        kwargs["min_new_tokens"] = cfg.max_new_tokens
    if cfg.sampling.temp <= 0:
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=cfg.sampling.temp, top_k=0)
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = 10
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(x, **kwargs)
    return [int(t) for t in out[0, x.shape[1]:]], time.perf_counter() - t0


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
