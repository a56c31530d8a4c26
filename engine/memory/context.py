"""A model and its cell cache: llama.cpp's llama_context, the thing that runs a batch."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.forward.device import synchronize_model
from engine.forward.attention import LayerRows, RowAttention, batch_layout, cell_layout, use_cell_attention
from engine.batch import Batch, check_batch
from engine.forward.lean import LeanForward, lean_reason
from engine.memory.cells import CellCache
from engine.memory.layer_kinds import layer_kinds, refusal


@dataclass
class DecodeResult:
    # [n_output_rows, vocab], float32, in batch row order of the rows with output=True (None: a tree round's
    # kept rows handed to the drafters, tree.sub_batch)
    logits: torch.Tensor | None
    seconds: float  # wall time of the forward
    hidden: torch.Tensor | None = None  # [n_rows, n_layers_kept * hidden], every batch row; see hidden_layers
    layers: tuple[int, ...] = ()  # the hidden layers side by side in `hidden`, in that order

    def hidden_of(self, wanted: tuple[int, ...]) -> torch.Tensor | None:
        """`hidden` with only the `wanted` layers, in that order: several drafters that read hidden states ask
        the context for the union of their layers, and each must read its own."""
        if self.hidden is None or not self.layers or tuple(wanted) == self.layers:  # () : not said, as given
            return self.hidden
        missing = [i for i in wanted if i not in self.layers]
        if missing:
            raise ValueError(f"hidden layers {missing} were not kept by this forward (kept: {self.layers})")
        width = self.hidden.shape[-1] // len(self.layers)
        return torch.cat([self.hidden[:, k * width:(k + 1) * width] for k in map(self.layers.index, wanted)], -1)


class ModelContext:
    """Runs batches of (token, pos, seq) rows through a causal LM on one shared CellCache."""

    def __init__(self, model, n_ctx: int, n_seq_max: int = 1, n_outputs_max: int | None = None, lean: bool = True,
                 attention_kernel: bool = True):
        cfg = model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        why_not = refusal(cfg)
        if why_not is not None:
            raise ValueError(f"this model cannot run on the cell cache: {why_not}")
        kinds = layer_kinds(cfg)
        head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // text_cfg.num_attention_heads
        n_kv = getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads
        param = next(model.parameters())
        # the lean Llama-family forward (engine/forward/lean.py) where the model allows it, transformers' forward otherwise
        self.lean_reason = lean_reason(model) if lean else "lean forward turned off"
        self.lean = LeanForward(model) if self.lean_reason is None else None
        self.model = model
        self.n_ctx = n_ctx  # cells in the cache, shared by all sequences
        self.n_seq_max = n_seq_max
        self.n_outputs_max = n_outputs_max  # logits rows a forward may return (None: no limit)
        self.n_vocab = int(text_cfg.vocab_size)
        self.device = param.device
        spread = layer_devices(model, text_cfg.num_hidden_layers)
        self.rows_device = torch.device("cpu") if spread and len(set(spread)) > 1 else self.device
        self.per_seq_attention = use_cell_attention(model)  # each sequence's rows attend to its own cells
        self.cache = CellCache(
            n_layers=text_cfg.num_hidden_layers, n_kv_heads=n_kv, head_dim=head_dim, n_cells=n_ctx,
            n_seq_max=n_seq_max, dtype=self.lean.cache_dtype if self.lean else param.dtype, device=param.device,
            kinds=kinds, by_seq=self.per_seq_attention, layer_devices=spread,
        )
        # every row over exactly its cells: the C kernel where it builds, SDPA per row otherwise (attention.py)
        self.attention = RowAttention(self.device, self.cache.dtype, use_kernel=attention_kernel)
        self.supports_trees = True  # the cell cache masks a draft tree by parent links (memory.py)
        self.n_forward = 0  # forwards run, for statistics
        # indices into transformers' hidden_states tuple (0 = embeddings, i = after layer i) that a drafter reads
        # from the target (llama_set_embeddings_layer_inp's analog); empty: none are returned
        self.hidden_layers: tuple[int, ...] = ()

    @torch.inference_mode()
    def decode(self, batch: Batch) -> DecodeResult:
        """One forward over the batch. Cells are claimed for every row; logits come back for output rows."""
        check_batch(batch, self.n_outputs_max)
        synchronize_model(self.model)  # on a card: the clock starts when the work queued before is done
        t0 = time.perf_counter()
        cache = self.cache
        # the lean forward reads only which cells each row sees: no mask is built for it
        mask = cache.prepare(batch) if self.lean is None else None
        cells = cache.claim(batch) if mask is None else None
        try:
            input_ids = torch.tensor([batch.tokens], dtype=torch.long, device=self.device)
            position_ids = torch.tensor([batch.pos], dtype=torch.long, device=self.device)
            # under a map over several devices the last hidden states are not on the first one: the rows to keep
            # stay on the CPU, an index torch takes on any device
            rows = torch.tensor(batch.output_rows(), dtype=torch.long, device=self.rows_device)
            extra = {}
            if mask is None:
                extra["cell_rows"] = self._rows_of_batch(batch, cells)
            elif self.per_seq_attention:
                extra["cell_rows"] = self._rows_of(mask)
            if self.lean is not None:
                logits, hidden = self.lean(input_ids[0], position_ids[0], self.cache, extra["cell_rows"], rows,
                                           self.hidden_layers)  # the lean forward runs on the CPU only
                self.n_forward += 1
                return DecodeResult(logits=logits.float(), seconds=time.perf_counter() - t0,
                                    hidden=None if hidden is None else hidden.float(), layers=self.hidden_layers)
            out = self.model(
                input_ids=input_ids, position_ids=position_ids, attention_mask=self._on_device(mask), cache=self.cache,
                use_cache=True, logits_to_keep=rows, output_hidden_states=bool(self.hidden_layers), **extra,
            )
        except Exception:
            self.cache.rollback_claim()
            raise
        self.n_forward += 1
        logits = out.logits[0].float()
        hidden = None
        if self.hidden_layers:  # under a device map each layer's states are on its own device: the logits' is the one
            hidden = torch.cat([out.hidden_states[i][0].to(logits.device) for i in self.hidden_layers], -1).float()
        synchronize_model(self.model)  # a card's calls return before their work is done: time the work
        return DecodeResult(logits=logits, seconds=time.perf_counter() - t0, hidden=hidden, layers=self.hidden_layers)

    def _on_device(self, mask):
        """The model's copy of the mask on its device, each distinct tensor moved once (kinds may share one)."""
        if not isinstance(mask, dict):
            return mask.to(self.device)
        moved = {}
        return {kind: moved.setdefault(id(m), m.to(self.device)) for kind, m in mask.items()}

    def _rows_of_batch(self, batch: Batch, cells: torch.Tensor):
        """The rows each layer attends over, read from the batch: one layout per distinct window."""
        cache = self.cache
        by_window = {}
        for w in dict.fromkeys(cache.kinds.windows.values()):
            by_window[w] = self.attention.rows(batch_layout(cache.cell_pos, cache.cell_seq, cache.n_live, batch,
                                                            cells, w))
        if len(by_window) == 1:
            return next(iter(by_window.values()))
        return LayerRows({kind: by_window[w] for kind, w in cache.kinds.windows.items()}, cache.kinds.types)

    def _rows_of(self, mask):
        """The rows each layer attends over, from the forward's mask (a dict of them where kinds differ)."""
        if not isinstance(mask, dict):
            return self.attention.rows(cell_layout(mask, self.cache.cell_pos[:mask.shape[-1]]))
        by_tensor = {}
        for m in mask.values():
            if id(m) not in by_tensor:
                by_tensor[id(m)] = self.attention.rows(cell_layout(m, self.cache.cell_pos[:m.shape[-1]]))
        return LayerRows({kind: by_tensor[id(m)] for kind, m in mask.items()}, self.cache.kinds.types)

    def describe_forward(self) -> str:
        """Which forward runs and why (the status line, the bench)."""
        if self.lean is None:
            return f"transformers' forward ({self.lean_reason})"
        return f"lean forward ({self.lean.describe()})"

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return self.cache.seq_rm(seq, p0, p1)

    def clear(self) -> None:
        self.cache.clear()


def layer_devices(model, n_layers: int) -> list[torch.device] | None:
    """Each decoder layer's device under accelerate's device map, else None (every layer on the first parameter's
    device). It is where the layer computes, so where its K/V come out: the device its weights are on, or, for a
    layer whose weights the map offloads, the device accelerate's hook runs it on."""
    if not getattr(model, "hf_device_map", None):
        return None
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or len(layers) != n_layers:
        return None
    out = []
    for layer in layers:
        run_on = getattr(getattr(layer, "_hf_hook", None), "execution_device", None)
        param = next(layer.parameters(), None)
        if run_on is None:
            run_on = param.device if param is not None and param.device.type != "meta" else "cpu"
        out.append(torch.device(f"cuda:{run_on}" if isinstance(run_on, int) else run_on))
    return out
