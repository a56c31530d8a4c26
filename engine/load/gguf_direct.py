"""A Llama-family (Llama, Mistral, Qwen2, Qwen3) or Gemma 3 GGUF built from its blocks: no float32 copy of the model.

transformers loads a GGUF by dequantising every tensor to float32 (gguf-py's `dequantize`) into a model it then
hands over whole: a 1B Q4_K_M file (0.8 GB) becomes 5 GB in memory and, as the cache's converted copy
(engine/load/gguf.py), 5 GB on disk; an 8B file would need 32 GB. Here the model is built without initialising
its weights (`no_init_weights`: torch.empty pages that are never written stay unallocated), and each tensor is
read from the file as it is stored:

- a linear whose block type a kernel multiplies (engine/forward/quant.py: Q4_1, Q4_0, Q5_0, Q8_0, Q4_K, and Q6_K
  times 8-bit inputs) gets the packed blocks and drops its float32 weight before anything writes it;
- the embedding table is dequantised in chunks of rows into a file under the cache's `mapped/` folder and mapped
  (engine/forward/mapped.py): a lookup reads only the rows it needs; a tied LM head reads the table's blocks;
- every other tensor (norms, biases, a linear of another type) is dequantised by gguf-py's
  `dequantize` into its parameter, as transformers does.

The values are the ones transformers' loader gives, bit for bit: q and k rows in the order its
`LlamaTensorProcessor` restores (llama.cpp's converter permutes them for its rotary layout in files of the
`llama` architecture, Mistral's among them; Qwen2's and Qwen3's converters do not), and every dequantisation gguf-py's or
proven equal to it (`QuantWeight.dequantize`, tests/test_gguf_direct.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.load.disk_cache import building

PERMUTED = ("llama", "mistral")  # model types whose GGUF q and k rows come permuted (general.architecture "llama")
# families whose norms llama.cpp's converter stores as 1 + w (transformers' Gemma2TensorProcessor subtracts the 1)
NORM_PLUS_ONE = ("gemma3_text",)
CHUNK_ROWS = 4096  # embedding rows dequantised at a time: 64 MB of float32 at 4096 wide
# llama.cpp's per-layer tensor names -> transformers' module names, per family
_NORMS = {"attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
          "attn_norm.weight": "input_layernorm.weight"}
_LAYER = {"llama": {**_NORMS, "ffn_norm.weight": "post_attention_layernorm.weight"},
          "gemma3_text": {**_NORMS, "post_attention_norm.weight": "post_attention_layernorm.weight",
                          "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                          "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}}
_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}


def hf_names(n_layers: int, model_type: str = "llama") -> dict[str, str]:
    """llama.cpp tensor name -> transformers parameter name, for every tensor a GGUF of the family may hold."""
    out = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    for i in range(n_layers):
        for gguf_name, hf in _LAYER.get(model_type, _LAYER["llama"]).items():
            out[f"blk.{i}.{gguf_name}"] = f"model.layers.{i}.{hf}"
        for gguf_name, hf in _LINEARS.items():
            for part in ("weight", "bias"):
                out[f"blk.{i}.{gguf_name}.{part}"] = f"model.layers.{i}.{hf}.{part}"
    return out


def stored_blocks(path: Path, device: str, prepack: bool, config) -> str:
    """The GGUF's quantisations our float32 path reads as stored (engine/forward/quant.py), "" without prepacking."""
    if not prepack:
        return ""
    from engine.forward.quant import MAPPED_FAMILIES, blocks_read

    # the families this load maps: Gemma 3's blocks are read as stored here, not by quant.attach
    return blocks_read(path, device, getattr(config, "model_type", ""), MAPPED_FAMILIES + NORM_PLUS_ONE)


def direct_reason(config, dtype_name: str, device: str, prepack: bool) -> str | None:
    """None where a GGUF of this config loads straight from its blocks, else why it goes through transformers."""
    from engine.forward.quant import MAPPED_FAMILIES, load_kernels

    if device != "cpu" or not prepack:
        return "blocks are read as stored only by the CPU's prepacked forward"
    if dtype_name != "float32":
        return f"a {dtype_name} model is built from transformers' float32 copy"
    if getattr(config, "model_type", "") not in MAPPED_FAMILIES + NORM_PLUS_ONE:
        return f"{config.model_type}: only the Llama family's and Gemma 3's GGUF names are mapped"
    if not load_kernels()[0]:
        return "the block kernels do not run on this CPU"
    return None


def load_direct(path: Path, config, dot: bool, table_folder: Path):
    """The model of the GGUF at `path` (config: `gguf_config(path)`), its linears packed from their blocks (dot:
    times 8-bit inputs in integers, else read as float32), its embedding table mapped from `table_folder`.
    Returns None where the model built from `config` is not the Llama layout this maps (the caller then loads
    through transformers)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from engine.forward.gguf_table import read_table
    from engine.forward.lean import family_reason

    with no_init_weights():  # every parameter is read from the file or dropped unread
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()
    names = hf_names(config.num_hidden_layers, config.model_type)
    tensors = {t.name: t for t in read_table(path)}
    params = dict(model.named_parameters(remove_duplicate=False))
    wanted = {names.get(n) for n in tensors} - {None}
    if family_reason(model) is not None or set(params) - wanted - {"lm_head.weight"} or \
            any(n not in names for n in tensors if n != "rope_freqs.weight"):
        return None  # a tensor this table does not name, or a parameter no tensor fills
    linears = _linear_names(model)
    with torch.no_grad():
        table = tensors["token_embd.weight"]
        _embedding(model, table, path, table_folder)
        _drop_file_pages(table)
        for name, t in tensors.items():
            hf = names.get(name)
            if hf is None or hf == "model.embed_tokens.weight":
                continue
            if hf.endswith(".weight") and hf.rsplit(".", 1)[0] in linears \
                    and _take_blocks(model, hf, t, dot, config):
                _drop_file_pages(t)
                continue
            params[hf].copy_(torch.from_numpy(_dequantized(t, config, name)))
            _drop_file_pages(t)
        # no head of its own: it is the table, as llama.cpp reads such a file (tied or not)
        if "output.weight" not in tensors and not _take_blocks(model, "lm_head.weight", table, dot, config):
            model.get_output_embeddings().weight = model.get_input_embeddings().weight
        _drop_file_pages(table)
    return model


def _drop_file_pages(t) -> None:
    """Unmap the pages of the file this tensor's read made resident (the page cache keeps them): the load's
    peak is then the model, not the model plus the file."""
    import mmap

    mapping = getattr(t.data, "_mmap", None)
    if mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
        mapping.madvise(mmap.MADV_DONTNEED)


def _linear_names(model) -> set[str]:
    from torch import nn

    return {name for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def _rows_order(name: str, n_rows: int, config) -> np.ndarray | None:
    """The file's rows in transformers' order for q and k of a permuted family (engine/forward/quant.py)."""
    from engine.forward.quant import _llama_reverse_permute

    if config.model_type not in PERMUTED:
        return None
    heads = {"attn_q": config.num_attention_heads,
             "attn_k": getattr(config, "num_key_value_heads", None) or config.num_attention_heads}
    short = name.split(".")[2] if name.startswith("blk.") else ""
    return _llama_reverse_permute(n_rows, heads[short]) if short in heads else None


def _dequantized(t, config, name: str) -> np.ndarray:
    """The tensor in float32 as gguf-py computes it, in the model's shape and row order."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(s) for s in reversed(t.shape))  # GGUF lists the fastest-moving axis first
    w = dequantize(np.asarray(t.data), GGMLQuantizationType(t.tensor_type)).reshape(shape).astype(np.float32)
    if config.model_type in NORM_PLUS_ONE and "norm.weight" in name:
        w = w - 1  # in float32, as transformers' Gemma2TensorProcessor computes it
    order = _rows_order(name, shape[0], config) if len(shape) == 2 else None
    return w if order is None else np.ascontiguousarray(w[order])


def _take_blocks(model, hf: str, t, dot: bool, config) -> bool:
    """Give the linear `hf` names its packed blocks where a kernel reads them; whether it took them."""
    import torch
    from gguf import GGMLQuantizationType

    from engine.forward.gemm import SmallGemm
    from engine.forward.prepack import _tied_elsewhere, install
    from engine.forward.quant import _GGML_KINDS, GROUP, QK_K, _unpack, load_kernels, pack_for

    fns, nb, _ = load_kernels()
    kind = _GGML_KINDS.get(GGMLQuantizationType(t.tensor_type).name)
    module = model.get_submodule(hf.rsplit(".", 1)[0])
    k, n = (int(s) for s in t.shape)
    if kind is None or len(t.shape) != 2 or n % nb or \
            k % (QK_K if kind in ("q4_k", "q6_k") else GROUP) or (kind == "q6_k" and not dot) or \
            (dot and "q4_1_dot" not in fns):
        return False
    raw = np.asarray(t.data).reshape(n, -1)
    order = _rows_order(t.name, n, config)
    step = n if order is not None else max(nb, CHUNK_ROWS // nb * nb)  # q, k: whole, to permute their rows
    parts, fn_kind = [], ""
    for start in range(0, n, step):  # blocks of nb outputs lie one after another: chunks of rows pack apart
        w = _unpack(kind, raw[start:start + step], min(step, n - start), k)
        w = w if order is None else w.rows(order)
        fn_kind, part = pack_for(w, nb, dot)
        parts.append(part)
    packed = parts[0] if len(parts) == 1 else torch.cat(parts)
    tied = id(module.weight) in _tied_elsewhere(model)
    install(module, SmallGemm(fns[fn_kind], packed, k, n, torch.float32, torch.float32, kind=fn_kind),
            drop_weight=not tied)
    return True


def _embedding(model, t, path: Path, folder: Path) -> None:
    """The input embedding (and a tied head's weight) as a mapping of its dequantised table, written once."""
    import torch
    from torch import nn

    from engine.forward.mapped import _touch, mark_entry
    from engine.load.gguf import gguf_fingerprint

    d, v = (int(s) for s in t.shape)
    file = folder / f"{path.stem}-{gguf_fingerprint(path)}-token_embd-float32-{v}x{d}.bin"
    try:
        with building(file):
            if not file.is_file() or file.stat().st_size != v * d * 4:
                folder.mkdir(parents=True, exist_ok=True)
                mark_entry(folder)
                _write_table(t, v, d, file)
            else:
                _touch(file)
        arr = np.memmap(file, dtype=np.float32, mode="c", shape=(v, d))
        param = nn.Parameter(torch.from_numpy(arr), requires_grad=False)
        param._mapped_array = arr  # the mapping lives as long as the parameter
    except OSError:  # a cache that cannot be written: the table in memory, as transformers' copy holds it
        table = np.empty((v, d), dtype=np.float32)
        for start, rows in _table_rows(t, v, d):
            table[start:start + len(rows)] = rows
        param = nn.Parameter(torch.from_numpy(table), requires_grad=False)
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and getattr(head, "weight", None) is emb.weight
    emb.weight = param
    if tied:
        head.weight = param


def _write_table(t, v: int, d: int, file: Path) -> None:
    """Dequantise the table's rows a chunk at a time into `file`, atomically."""
    import os

    tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for _, rows in _table_rows(t, v, d):
                f.write(rows.tobytes())
        tmp.rename(file)
    finally:
        tmp.unlink(missing_ok=True)


def _table_rows(t, v: int, d: int):
    """(first row, rows [n, d] float32) of the table, dequantised by gguf-py a chunk at a time."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = np.asarray(t.data).reshape(v, -1)
    qtype = GGMLQuantizationType(t.tensor_type)
    for start in range(0, v, CHUNK_ROWS):
        yield start, dequantize(raw[start:start + CHUNK_ROWS], qtype).reshape(-1, d).astype(np.float32)
