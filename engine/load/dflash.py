"""DFlash and DSpark block drafters' checkpoints in their two published layouts, read into one form.

The layouts, as their reference code defines them (read for the names and equations; no code taken):
- the authors' directory (github.com/z-lab/dflash, dflash/model.py, DFlashDraftModel; DSpark exports such as
  satgeze/Qwen3.6-27B-DSpark): a Qwen3-like config.json with `block_size` and `dflash_config` {`mask_token_id`,
  `target_layer_ids`} (DSpark may give them at the top level, or speculators-style under
  `transformer_layer_config` with `aux_hidden_state_layer_ids`), weights in model.safetensors: `fc`,
  `hidden_norm`, `norm`, `layers.{i}.*` (a Qwen3 decoder layer), and for DSpark
  `markov_head.markov_w1` [vocab, rank], `markov_head.markov_w2` [draft vocab, rank], optionally
  `confidence_head.proj` [1, hidden + rank] and a reduced vocabulary's `lm_head` with `d2t` offsets; any of them
  may carry a `model.` prefix. `target_layer_ids` count layer outputs: the features are transformers'
  hidden_states[id + 1].
- llama.cpp's GGUF (convert_hf_to_gguf.py, conversion/qwen.py DFlashModel and DSparkModel; src/models/dflash.cpp):
  architecture `dflash`, `dflash.block_size`, `dflash.target_layers` (the ids + 1: layer inputs, the same
  hidden_states numbering), `dflash.sample_from_anchor`, `dflash.attention.causal`,
  `tokenizer.ggml.mask_token_id`; tensors `fc`, `enc.output_norm`, `output_norm`, `blk.{i}.*`, `markov_w1`,
  `markov_w2`, `conf_proj`, and `d2t` as absolute target ids.
What neither draft computes here (DFlash2's selector and convolutions, sliding windows, DeepSeek-V4 DSpark's
hyper-connections, scaled logits) is refused by name. Only data is read; no code from a checkpoint runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

# reference name inside layer i -> ours; the same for both layouts' top-level tensors
HF_LAYER = {"self_attn.q_proj.weight": "q", "self_attn.k_proj.weight": "k", "self_attn.v_proj.weight": "v",
            "self_attn.o_proj.weight": "o", "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
            "input_layernorm.weight": "attn_norm", "post_attention_layernorm.weight": "ffn_norm",
            "mlp.gate_proj.weight": "gate", "mlp.up_proj.weight": "up", "mlp.down_proj.weight": "down"}
HF_TOP = {"fc.weight": "fc", "hidden_norm.weight": "hidden_norm", "norm.weight": "norm", "lm_head.weight": "lm_head",
          "embed_tokens.weight": "embed", "markov_head.markov_w1.weight": "markov_w1",
          "markov_head.markov_w2.weight": "markov_w2", "confidence_head.proj.weight": "conf_proj",
          "confidence_head.proj.bias": "conf_bias", "d2t": "d2t"}
GGUF_LAYER = {"attn_q.weight": "q", "attn_k.weight": "k", "attn_v.weight": "v", "attn_output.weight": "o",
              "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm", "attn_norm.weight": "attn_norm",
              "ffn_norm.weight": "ffn_norm", "ffn_gate.weight": "gate", "ffn_up.weight": "up",
              "ffn_down.weight": "down"}
GGUF_TOP = {"fc.weight": "fc", "enc.output_norm.weight": "hidden_norm", "output_norm.weight": "norm",
            "output.weight": "lm_head", "token_embd.weight": "embed", "markov_w1.weight": "markov_w1",
            "markov_w2.weight": "markov_w2", "conf_proj.weight": "conf_proj", "conf_proj.bias": "conf_bias",
            "d2t": "d2t"}
REQUIRED_TOP = ("fc", "hidden_norm", "norm")
OPTIONAL_TOP = ("lm_head", "embed", "markov_w1", "markov_w2", "conf_proj", "conf_bias", "d2t")
IGNORED = {"t2d"}  # the inverse of d2t: nothing the drafter needs
# GGUF metadata of what is not computed here: key suffix after "dflash." -> what it is
REFUSED_KEYS = {"attention.sliding_window": "a sliding window", "hyper_connection.count": "hyper-connections "
                "(DeepSeek-V4 DSpark)", "selector.top_k": "DFlash2's selector", "embedding_scale": "a scaled embedding",
                "attention.scale": "a set attention scale", "attention.value_scale": "a value scale",
                "logit_scale": "scaled logits", "final_logit_softcapping": "soft-capped logits"}


@dataclass
class DFlashCheckpoint:
    layout: str  # "hf" (the authors' directory) or "gguf" (llama.cpp's file)
    hidden: int  # the draft's width, and each target feature's
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    rope_theta: float
    block_size: int  # rows of one drafting forward, as trained
    mask_token_id: int  # the token id of the block's masked rows
    hidden_layers: tuple[int, ...]  # the target features, transformers' hidden_states numbering (layer inputs)
    sample_from_anchor: bool = True  # DSpark: the anchor row proposes the first draft token (else row 1 does)
    causal: bool = False  # the block's rows attend causally among themselves (the published drafts do not)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # our names: REQUIRED_TOP, OPTIONAL_TOP, layers.i.*
    d2t: torch.Tensor | None = None  # draft row -> absolute target token id, for a reduced draft vocabulary

    @property
    def kind(self) -> str:
        """"dspark" where the checkpoint carries the Markov head, else "dflash" (llama.cpp's auto-detection)."""
        return "dspark" if "markov_w1" in self.tensors else "dflash"

    @property
    def has_confidence(self) -> bool:
        return "conf_proj" in self.tensors


def default_layer_ids(n_target_layers: int, n_draft_layers: int) -> list[int]:
    """The authors' choice when a config names none (dflash/model.py build_target_layer_ids): one layer in the
    middle, or n_draft_layers spread evenly from layer 1 to layer n - 3, as layer-output ids."""
    if n_draft_layers == 1:
        return [n_target_layers // 2]
    span = n_target_layers - 4
    return [int(round(1 + i * span / (n_draft_layers - 1))) for i in range(n_draft_layers)]


def _hf_config(path: Path) -> dict | None:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _hf_weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return [path / n for n in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return sorted(path.glob("*.safetensors"))


def detect(path: Path | str | None) -> str | None:
    """"hf", "gguf" or None (not a DFlash/DSpark checkpoint): a GGUF of architecture dflash, or a directory
    whose config names a DFlash or DSpark architecture or carries dflash_config."""
    if path is None:
        return None
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        from gguf import GGUFReader

        try:
            field_ = GGUFReader(str(path)).fields.get("general.architecture")
        except (OSError, ValueError):
            return None
        return "gguf" if field_ is not None and field_.contents() == "dflash" else None
    cfg = _hf_config(path) if path.is_dir() else None
    if cfg is None or not _hf_weight_files(path):
        return None
    archs = " ".join(cfg.get("architectures") or [])
    return "hf" if "dflash_config" in cfg or "DFlash" in archs or "DSpark" in archs else None


def _refuse_hf(cfg: dict, dcfg: dict) -> None:
    for key, what in (("conv_kernel_size", "DFlash2's convolutions"), ("use_swa", "a sliding window"),
                      ("attention_value_scale", "a value scale"), ("output_multiplier", "scaled logits"),
                      ("input_embedding_scale", "a scaled embedding"),
                      ("final_logit_softcapping", "soft-capped logits")):
        if dcfg.get(key) or cfg.get(key):
            raise ValueError(f"DFlash checkpoint: {what} ({key}) is not supported")
    if cfg.get("use_sliding_window"):
        raise ValueError("DFlash checkpoint: a sliding window (use_sliding_window) is not supported")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise ValueError("DFlash checkpoint: biased projections (attention_bias) are not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"DFlash checkpoint: hidden_act {cfg['hidden_act']} is not supported (only silu)")
    if cfg.get("markov_head_type", "vanilla") != "vanilla":
        raise ValueError(f"DSpark checkpoint: markov_head_type {cfg['markov_head_type']} is not supported")
    rope = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    if rope.get("rope_type", rope.get("type", "default")) != "default" or rope.get("partial_rotary_factor", 1) != 1:
        raise ValueError("DFlash checkpoint: only default RoPE over the whole head is supported (rope_scaling)")


def _hf_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for f in _hf_weight_files(path):
        state.update(load_file(str(f)))
    return state


def _rename(state: dict[str, torch.Tensor], top: dict, layer: dict, prefix: str, where: str):
    """Stored names -> ours; unknown tensors refused by name (a wrong mapping fails loudly)."""
    out = {}
    for key, t in state.items():
        name = key[len("model."):] if key.startswith("model.") else key
        if name in IGNORED:
            continue
        if name in top:
            out[top[name]] = t
            continue
        if name.startswith(prefix):
            i, rest = name[len(prefix):].split(".", 1)
            if rest in layer:
                out[f"layers.{int(i)}.{layer[rest]}"] = t
                continue
        raise ValueError(f"{where}: tensor {key} is not one a DFlash or DSpark draft computes")
    return out


def read_hf(path: Path) -> DFlashCheckpoint:
    cfg = _hf_config(path) or {}
    speculators = "transformer_layer_config" in cfg or "aux_hidden_state_layer_ids" in cfg
    cfg = {**cfg, **(cfg.get("transformer_layer_config") or {})}
    dcfg = cfg.get("dflash_config") or {}
    _refuse_hf(cfg, dcfg)
    hidden, heads, n_layers = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"])
    if "aux_hidden_state_layer_ids" in cfg:
        layers = [int(i) for i in cfg["aux_hidden_state_layer_ids"]]  # already hidden_states indices
    else:
        ids = dcfg.get("target_layer_ids", cfg.get("target_layer_ids"))
        if ids is None:
            ids = default_layer_ids(int(cfg["num_target_layers"]), n_layers)
        layers = [int(i) + 1 for i in ids]
    mask = dcfg.get("mask_token_id", cfg.get("mask_token_id"))
    if mask is None:
        raise ValueError(f"{path}: DFlash checkpoint without mask_token_id (dflash_config)")
    rope = {**(cfg.get("rope_scaling") or {}), **(cfg.get("rope_parameters") or {})}
    tensors = _rename(_hf_tensors(path), HF_TOP, HF_LAYER, "layers.", str(path))
    d2t = tensors.pop("d2t", None)
    if d2t is not None:
        d2t = d2t.long() + torch.arange(len(d2t))  # offsets, as EAGLE-3 stores them -> absolute ids
    return DFlashCheckpoint(
        layout="hf", hidden=hidden, n_layers=n_layers, n_heads=heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate=int(cfg["intermediate_size"]), rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        block_size=int(dcfg.get("block_size", cfg.get("block_size", 16))), mask_token_id=int(mask),
        hidden_layers=tuple(layers), sample_from_anchor=bool(cfg.get("sample_from_anchor", not speculators)),
        causal=bool(cfg.get("is_causal", dcfg.get("causal", False))), tensors=tensors, d2t=d2t)


def _gguf_tensors(reader) -> dict[str, torch.Tensor]:
    """Every tensor of the file in torch's layout (the reverse of GGUF's ne order), quantised blocks expanded."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    plain = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.I64,
             GGMLQuantizationType.I32)
    out = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        data = t.data if t.tensor_type in plain else dequantize(t.data, t.tensor_type)
        arr = np.array(data, copy=True).reshape(shape)
        out[t.name] = torch.from_numpy(arr if arr.dtype == np.int64 else arr.astype(np.float32))
    return out


def _gguf_value(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    if len(f.data) > 1 or f.name.endswith("target_layers"):
        return [f.contents(i) for i in range(len(f.data))]
    return f.contents()


def read_gguf(path: Path) -> DFlashCheckpoint:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def key(name: str, default=None):
        return _gguf_value(reader, f"dflash.{name}", default)

    for name, what in REFUSED_KEYS.items():
        if key(name):
            raise ValueError(f"{path}: {what} (dflash.{name}) is not supported")
    layers = key("target_layers")
    if not layers:
        raise ValueError(f"{path}: a DFlash GGUF without dflash.target_layers")
    mask = _gguf_value(reader, "tokenizer.ggml.mask_token_id")
    if mask is None:
        raise ValueError(f"{path}: a DFlash GGUF without tokenizer.ggml.mask_token_id")
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", hidden // heads))
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise ValueError(f"{path}: RoPE over part of the head (dflash.rope.dimension_count) is not supported")
    tensors = _rename(_gguf_tensors(reader), GGUF_TOP, GGUF_LAYER, "blk.", str(path))
    d2t = tensors.pop("d2t", None)
    return DFlashCheckpoint(
        layout="gguf", hidden=hidden, n_layers=int(key("block_count")), n_heads=heads,
        n_kv_heads=int(key("attention.head_count_kv", heads)), head_dim=head_dim,
        intermediate=int(key("feed_forward_length")), rms_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)), block_size=int(key("block_size", 16)),
        mask_token_id=int(mask), hidden_layers=tuple(int(i) for i in layers),
        sample_from_anchor=bool(key("sample_from_anchor", True)), causal=bool(key("attention.causal", False)),
        tensors=tensors, d2t=None if d2t is None else d2t.long())


def _check(ck: DFlashCheckpoint, where: str) -> DFlashCheckpoint:
    """Every tensor the draft computes with, in the shape its config gives (ValueError naming the first that is
    not)."""
    h, hd, inter = ck.hidden, ck.head_dim, ck.intermediate
    n_q, n_kv = ck.n_heads * hd, ck.n_kv_heads * hd
    fc = ck.tensors.get("fc")
    n_in = int(fc.shape[-1]) if fc is not None and fc.shape[-1] % len(ck.hidden_layers) == 0 else -1
    want = {"fc": (h, n_in), "hidden_norm": (h,), "norm": (h,)}
    for i in range(ck.n_layers):
        want.update({f"layers.{i}.{k}": s for k, s in (
            ("q", (n_q, h)), ("k", (n_kv, h)), ("v", (n_kv, h)), ("o", (h, n_q)), ("q_norm", (hd,)), ("k_norm", (hd,)),
            ("attn_norm", (h,)), ("ffn_norm", (h,)), ("gate", (inter, h)), ("up", (inter, h)), ("down", (h, inter)))})
    for name, shape in want.items():
        got = ck.tensors.get(name)
        if got is None:
            raise ValueError(f"{where}: DFlash checkpoint lacks tensor {name}")
        if tuple(got.shape) != shape:
            raise ValueError(f"{where}: tensor {name} has shape {tuple(got.shape)}, its config gives {shape}")
    extra = sorted(set(ck.tensors) - set(want) - set(OPTIONAL_TOP))
    if extra:
        raise ValueError(f"{where}: unexpected tensors {', '.join(extra[:6])}")
    if ("markov_w1" in ck.tensors) != ("markov_w2" in ck.tensors):
        raise ValueError(f"{where}: a DSpark Markov head needs both markov_w1 and markov_w2")
    if ck.d2t is not None and "lm_head" not in ck.tensors:
        raise ValueError(f"{where}: a reduced draft vocabulary (d2t) needs the draft's own lm_head")
    if ck.block_size < 2:
        raise ValueError(f"{where}: block_size {ck.block_size}: a block drafts at least one token after its anchor")
    return ck


def read_dflash(path: Path | str) -> DFlashCheckpoint:
    """The checkpoint at `path` (a directory in the authors' layout, or llama.cpp's GGUF), weights in float32;
    ValueError with the reason when it is not one this drafter can run."""
    path = Path(path)
    layout = detect(path)
    if layout is None:
        raise ValueError(f"{path}: not a DFlash or DSpark checkpoint (a directory with config.json carrying "
                         "dflash_config and model.safetensors, or a GGUF of architecture dflash)")
    ck = read_hf(path) if layout == "hf" else read_gguf(path)
    ck.tensors = {k: v.float() if v.is_floating_point() else v for k, v in ck.tensors.items()}
    return _check(ck, str(path))


def dflash_kind(path: Path | str | None) -> str | None:
    """The drafter a checkpoint drafts as, without reading its weights: "draft-dspark" where it has a Markov
    head, "draft-dflash" otherwise; None for what is no DFlash checkpoint."""
    layout = detect(path)
    if layout is None:
        return None
    if layout == "gguf":
        from gguf import GGUFReader

        names = {t.name for t in GGUFReader(str(path)).tensors}
        return "draft-dspark" if "markov_w1.weight" in names else "draft-dflash"
    from safetensors import safe_open

    for f in _hf_weight_files(Path(path)):
        with safe_open(str(f), framework="pt") as sf:
            if any(k.endswith("markov_head.markov_w1.weight") for k in sf.keys()):
                return "draft-dspark"
    return "draft-dflash"
