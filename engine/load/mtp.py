"""A target's own multi-token-prediction (MTP, "NextN") layers, read from its checkpoint.

DeepSeek-V3's layout, which GLM-4.5 and others share: the config counts them (`num_nextn_predict_layers`,
transformers' `num_mtp_layers`), and layer k is stored after the decoder as `model.layers.{n_layers + k}.*`:
`enorm`, `hnorm`, `eh_proj` (the projection of [norm(embedding); norm(hidden)]), `shared_head.norm`, the
decoder block's own tensors (`self_attn.*`, `mlp.*`, the two layer norms; a mixture of experts one tensor per
expert), and copies of the embedding table and the LM head (`embed_tokens`, `shared_head.head`) that are the
target's and are not read again. The transformers load of the target skips them
(`_keys_to_ignore_on_load_unexpected`); here they become transformers' own `MtpModel`, whose embedding, head
and rotary tables are the target's, so the drafter (engine/draft/mtp.py) runs exactly the layers
transformers' MTP drafting runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

SHARED = ("embed_tokens.weight", "shared_head.head.weight")  # the target's own tables, stored again per layer
OWN = {"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "eh_proj.weight",
       "shared_head.norm.weight": "post_norm.weight"}
EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def mtp_layer_count(model) -> int:
    """MTP layers the target's config declares (0: none)."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(getattr(cfg, "num_mtp_layers", None) or getattr(cfg, "num_nextn_predict_layers", None) or 0)


def checkpoint_dir(target) -> Path | None:
    """The directory the target was loaded from, if it was one."""
    for name in (getattr(target, "name", None), getattr(target.model.config, "name_or_path", None)):
        if name and Path(str(name)).expanduser().is_dir():
            return Path(str(name)).expanduser()
    return None


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / n for n in names]
    return sorted(path.glob("*.safetensors"))


def read_mtp_tensors(path: Path, n_layers: int, n_mtp: int) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors of layers n_layers .. n_layers + n_mtp - 1, under their stored names."""
    from safetensors import safe_open

    prefixes = tuple(f"model.layers.{n_layers + k}." for k in range(n_mtp))
    out = {}
    for f in _weight_files(path):
        with safe_open(str(f), framework="pt") as sf:
            for key in sf.keys():
                if key.startswith(prefixes):
                    out[key] = sf.get_tensor(key)
    return out


def _fuse_experts(parts: dict[str, torch.Tensor], wanted: set[str]) -> dict[str, torch.Tensor]:
    """One tensor per expert -> the stacked tensors transformers' expert modules hold (gate and up side by side
    in gate_up_proj [experts, 2 * inter, hidden], down_proj [experts, hidden, inter]), where the module holds
    them stacked; a checkpoint already stacked passes through."""
    groups: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    out = {}
    for key, t in parts.items():
        m = EXPERT.match(key)
        if m is None or f"{m.group(1)}.gate_up_proj" not in wanted:
            out[key] = t
            continue
        groups.setdefault(m.group(1), {}).setdefault(m.group(3), {})[int(m.group(2))] = t
    for base, kinds in groups.items():
        n = max(max(d) for d in kinds.values()) + 1
        if any(sorted(kinds.get(k, {})) != list(range(n)) for k in ("gate_proj", "up_proj", "down_proj")):
            raise ValueError(f"MTP layer tensors {base}.*: not every one of {n} experts has gate, up and down")
        out[f"{base}.gate_up_proj"] = torch.stack([torch.cat([kinds["gate_proj"][e], kinds["up_proj"][e]])
                                                   for e in range(n)])
        out[f"{base}.down_proj"] = torch.stack([kinds["down_proj"][e] for e in range(n)])
    return out


def mtp_state(stored: dict[str, torch.Tensor], n_layers: int, wanted: set[str]) -> dict[str, torch.Tensor]:
    """Stored names -> MtpModel's parameter names (layers.k.{enorm,hnorm,eh_proj,post_norm,mtp_block.*})."""
    renamed = {}
    for key, t in stored.items():
        layer, rest = key[len("model.layers."):].split(".", 1)
        if rest in SHARED:
            continue
        prefix = f"layers.{int(layer) - n_layers}."
        renamed[prefix + (OWN[rest] if rest in OWN else "mtp_block." + rest)] = t
    return _fuse_experts(renamed, wanted)


def mtp_reason(target) -> str | None:
    """Why draft-mtp cannot draft for this target (None: it can), from its config and the names of its
    checkpoint's tensors, without reading the layers: the page and the arena ask at every model load."""
    from safetensors import safe_open

    model = getattr(target, "model", None)
    if model is None or mtp_layer_count(model) == 0:
        return "the target has no MTP layers (its config declares none)"
    if not hasattr(model.config, "get_mtp_config"):
        return f"transformers builds no MTP layers for {type(model).__name__}"
    path = checkpoint_dir(target)
    if path is None:
        return "the MTP layers are read from the target's checkpoint directory, and it was not loaded from one"
    first = f"model.layers.{int(model.config.get_text_config().num_hidden_layers)}."
    for f in _weight_files(path):
        with safe_open(str(f), framework="pt") as sf:
            if any(k.startswith(first) for k in sf.keys()):
                return None
    return "the target's checkpoint lacks its MTP layers (the config declares them)"


def load_mtp(target):
    """transformers' MtpModel for the target, its layers read from the target's checkpoint (ValueError naming
    what is missing: no MTP layers in the config, no directory, or tensors the layers need)."""
    from transformers.modeling_layers import MtpModel

    model = target.model
    n_mtp = mtp_layer_count(model)
    if n_mtp == 0:
        raise ValueError("draft-mtp needs a target with MTP layers; this model's config declares none "
                         "(num_nextn_predict_layers)")
    if not hasattr(model.config, "get_mtp_config"):
        raise ValueError(f"draft-mtp: transformers builds no MTP layers for {type(model).__name__}")
    path = checkpoint_dir(target)
    if path is None:
        raise ValueError("draft-mtp reads the MTP layers from the target's checkpoint directory; "
                         f"'{target.name}' is not one")
    n_layers = int(model.config.get_text_config().num_hidden_layers)
    stored = read_mtp_tensors(path, n_layers, n_mtp)
    if not stored:
        raise ValueError(f"draft-mtp: the config declares {n_mtp} MTP layer(s) but {path} holds no tensors "
                         f"model.layers.{n_layers}.* (a checkpoint without its MTP layers)")
    with torch.device("meta"):
        net = MtpModel(model, n_mtp)
    own = {k for k in net.state_dict() if not k.startswith(("embed_tokens.", "shared_head.", "rotary_emb."))}
    state = mtp_state(stored, n_layers, own)
    missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
    if missing or unexpected:
        raise ValueError(f"draft-mtp: the MTP layers in {path} do not fit {type(model).__name__}'s: "
                         f"missing {', '.join(missing) or 'none'}; unexpected {', '.join(unexpected) or 'none'}")
    dtype = model.get_input_embeddings().weight.dtype
    net.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    net.tie_with_main_model(model)
    net.set_attn_implementation("sdpa")  # the drafter gives it a 4D mask over its cells
    return net.eval()
