"""llama.cpp as a yardstick: the embedded GGUF run through llama-cpp-python with plain greedy decoding.

Why: the bench measures our HF engines on this machine; the same Q4_1 file through llama.cpp shows where they
stand against a native CPU runtime. It is optional: llama-cpp-python builds from source
(requirements-llamacpp.txt, ./scripts/setup.sh --llamacpp), no test needs it, and nothing here imports it
until a model is opened.

What runs is as plain as our own greedy path:
- the prompt ids go in exactly as given: Llama.generate never tokenises, so no BOS is added (only
  Llama.tokenize adds one);
- each token is llama.cpp's greedy sampler, the first argmax of the last logits; the repeat, frequency and
  presence penalties sit at their no-op values, where llama.cpp skips them, and with temp 0 no top-k/top-p/min-p
  stage is built;
- every call starts from an empty KV cache: reset() before generate(), so Llama.generate's prefix reuse never
  applies and every call pays for its whole prompt, as a fresh request would.

Time it on an idle machine: with as many threads as cores, llama.cpp's OpenMP threads spin at each op's
barrier, and another busy process can stretch a call many times over (torch's threads suffer the same way).
"""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path


class LlamaCppUnavailable(RuntimeError):
    """llama-cpp-python is not installed; str(e) says how to install it."""

    def __init__(self) -> None:
        super().__init__("llama-cpp-python is not installed (optional): ./scripts/setup.sh --llamacpp, "
                         "or .venv/bin/pip install -r requirements-llamacpp.txt")


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


@dataclass
class LlamaCppRunner:
    llm: object  # a llama_cpp.Llama
    n_ctx: int  # its context size: prompt plus new tokens must fit
    n_threads: int  # threads for both the prompt and the per-token decode

    def generate(self, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int],
                 ignore_eos: bool = False) -> tuple[list[int], float]:
        """Greedy continuation of `prompt_ids`; returns (new token ids, wall seconds of the whole call).

        Stops after `max_new_tokens`, or at the first id in `eos_ids` (included in the result) unless
        `ignore_eos`. The seconds include the KV reset and the prompt's forward.
        """
        _check_fits(len(prompt_ids), max_new_tokens, self.n_ctx)
        t0 = time.perf_counter()
        out: list[int] = []
        if max_new_tokens > 0:
            self.llm.reset()
            stream = self.llm.generate([int(t) for t in prompt_ids], temp=0.0, repeat_penalty=1.0,
                                       frequency_penalty=0.0, presence_penalty=0.0, reset=True)
            for tok in stream:
                out.append(int(tok))
                if len(out) >= max_new_tokens or (not ignore_eos and out[-1] in eos_ids):
                    break
            stream.close()
        return out, time.perf_counter() - t0

    def evaluated_ids(self) -> list[int]:
        """The ids llama.cpp holds in its KV cache after the last call (prompt, then all but the last new id)."""
        return [int(t) for t in self.llm.input_ids[: self.llm.n_tokens]]

    def close(self) -> None:
        self.llm.close()


def _check_fits(n_prompt: int, max_new_tokens: int, n_ctx: int) -> None:
    if n_prompt == 0:
        raise ValueError("empty prompt")
    if n_prompt + max_new_tokens > n_ctx:
        raise ValueError(f"prompt ({n_prompt}) + max_new_tokens ({max_new_tokens}) exceed n_ctx ({n_ctx})")


def _default_threads() -> int:
    import torch

    return torch.get_num_threads()  # the same as our HF engines use, for a fair comparison


def open_model(gguf_path: str | Path | None = None, n_ctx: int = 2048,
               n_threads: int | None = None) -> LlamaCppRunner:
    """Load a GGUF (the embedded SmolLM2 by default) into llama.cpp, CPU only."""
    if not available():
        raise LlamaCppUnavailable()
    from llama_cpp import Llama

    if gguf_path is None:
        from engine.load.models import embedded_gguf_path

        gguf_path = embedded_gguf_path()
    threads = n_threads or _default_threads()
    llm = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                n_gpu_layers=0, logits_all=False, verbose=False)
    return LlamaCppRunner(llm=llm, n_ctx=n_ctx, n_threads=threads)
