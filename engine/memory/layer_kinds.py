"""The attention kinds of a model's layers, and the position schemes the cell cache cannot express.

transformers names each decoder layer's attention in `config.layer_types` ("full_attention",
"sliding_attention", ...) and builds one mask per kind (masking_utils.create_causal_mask and
create_sliding_window_causal_mask), handed to the model as a dict keyed by kind. Gemma 2 / 3 and Cohere 2
alternate windowed and global layers; Qwen2 windows the layers from `max_window_layers` on; Mistral windows every
layer without naming kinds. The cell cache follows the same split: one visibility rule per kind
(engine/memory/cells.py), one row layout per distinct window (engine/forward/attention.py).

A cell holds a key already rotated by its position, so any scheme that is a function of a token's own position
(RoPE, learned absolute embeddings, no position at all as in SmolLM3's NoPE layers) is exact on cells. A scheme
that biases each score by the distance between two tokens outside the key (ALiBi), that rotates by several
position streams (mRoPE) or that masks by fixed chunks of the sequence is not expressed by this cache:
`refusal` names the family and why, and such a model is never run.
"""

from __future__ import annotations

from dataclasses import dataclass

FULL, SLIDING = "full_attention", "sliding_attention"
# kinds the cells express; recurrent and convolution kinds run on the model's own cache (engine/memory/stateful.py)
CELL_KINDS = (FULL, SLIDING)
ALIBI_FAMILIES = ("bloom", "mpt", "jais")


@dataclass(frozen=True)
class LayerKinds:
    """Per decoder layer its attention kind, and per kind the window (None: the layer sees its whole past)."""

    types: tuple[str, ...]  # [n_layers]
    windows: dict  # kind -> window in positions, or None

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.types))

    @property
    def uniform(self) -> bool:
        """Every layer sees the same cells: one mask, one layout serve all."""
        return len({self.windows[k] for k in self.kinds}) <= 1

    @property
    def smallest_window(self) -> int | None:
        sizes = [w for w in self.windows.values() if w is not None]
        return min(sizes) if sizes else None

    def window(self, kind: str) -> int | None:
        return self.windows[kind]


def text_config(cfg):
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def layer_kinds(cfg) -> LayerKinds:
    """The kinds of `cfg`'s layers. Raises ValueError for a kind the cells do not express."""
    cfg = text_config(cfg)
    n_layers = int(cfg.num_hidden_layers)
    window = getattr(cfg, "sliding_window", None)
    if window is not None and not getattr(cfg, "use_sliding_window", True):
        window = None
    types = getattr(cfg, "layer_types", None)
    if not types:  # no kinds named: every layer windowed alike (Mistral) or none is
        kind = SLIDING if window is not None else FULL
        return LayerKinds(types=(kind,) * n_layers, windows={kind: None if window is None else int(window)})
    types = tuple(types)
    if len(types) != n_layers:
        raise ValueError(f"layer_types names {len(types)} layers, the model has {n_layers}")
    unknown = sorted(set(types) - set(CELL_KINDS))
    if unknown:
        raise ValueError(f"layers of kind {', '.join(unknown)}, which the cell cache does not express")
    if SLIDING in types and window is None:
        raise ValueError("sliding_attention layers without a sliding_window")
    windows = {k: (int(window) if k == SLIDING else None) for k in dict.fromkeys(types)}
    return LayerKinds(types=types, windows=windows)


def refusal(cfg) -> str | None:
    """Why a model of this config cannot run on the cell cache at all (positions it cannot express), or None.
    Checked at load, before any forward: a refused model is never run."""
    cfg = text_config(cfg)
    family = getattr(cfg, "model_type", "") or type(cfg).__name__
    if family in ALIBI_FAMILIES or getattr(cfg, "alibi", False):
        return (f"{family}: ALiBi adds a bias by the distance between two tokens to every score, which a cell "
                f"(a key rotated by its own position) does not hold")
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(rope, dict) and ("mrope_section" in rope or rope.get("rope_type") == "mrope"):
        return f"{family}: mRoPE rotates by several position streams; a row has one position here"
    if getattr(cfg, "attention_chunk_size", None) or "chunked_attention" in (getattr(cfg, "layer_types", None) or ()):
        return f"{family}: chunked attention masks by fixed chunks of the sequence, not by a window behind a row"
    types = set(getattr(cfg, "layer_types", None) or ())
    if types and types <= set(CELL_KINDS):
        try:
            layer_kinds(cfg)
        except ValueError as e:
            return f"{family}: {e}"
    return None
