"""A model that keeps state the cell cache cannot hold: recurrent, conv and hybrid models on their own cache.

Mamba, Mamba2 and hybrids (Jamba, LFM2, ...) carry a recurrent state and/or a short convolution window per
layer (transformers' `LinearAttentionLayer` in `DynamicCache.layers`) beside ordinary attention K/V. A
recurrent state summarises every token so far and cannot be rewound, so such a memory cannot drop a tail:
llama.cpp's COMMON_CONTEXT_SEQ_RM_TYPE_FULL, where the engine checkpoints before drafting and restores + replays
on rejection. What must be saved is only what re-running tokens cannot rebuild (llama.cpp's
LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY): the recurrent and conv
states and sliding-window K/V; full-attention K/V are simply cut back to the checkpoint's length.

Layers without a recurrent state (attention, sliding-window attention, LFM2's short convolutions) record the
past during a forward (`activate_past_recording`), so the tokens of the last forward can still be removed:
llama.cpp's COMMON_CONTEXT_SEQ_RM_TYPE_RS, reversible state for up to one round of draft. The engine then cuts a rejected tail
directly and never needs a checkpoint.

Each sequence has its own cache object, so slots run one forward each (they cannot share a batch the way cells
do), and a prefix cannot be shared between sequences. Positions of a sequence must arrive in order.
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

from engine.batch import Batch, check_batch
from engine.forward.device import synchronize_model
from engine.memory.context import DecodeResult
from engine.memory.rs_steps import StepRecorder


class StateMemory:
    """The memory of a StatefulContext, with the cell cache's query/removal interface (seq_rm, seq_pos_max...)."""

    can_share = False  # a prefix cannot be stored once for several sequences (no seq_cp)

    def __init__(self):
        self.caches: dict[int, DynamicCache] = {}  # seq -> the model's own cache for it
        self.n_past: dict[int, int] = {}  # seq -> tokens in its cache
        self.n_last: dict[int, int] = {}  # seq -> tokens of its last forward: what RS can still remove
        # seq -> layer -> recurrent states after the last tokens of its last forward (see rs_steps.py)
        self.rs_trace: dict[int, dict[int, list[torch.Tensor]]] = {}
        self.rs_limit: int | None = None  # longest removable tail where a recurrent state must be put back

    # ---- the cell cache's interface ------------------------------------------------------------------------

    def n_used(self) -> int:
        return sum(self.n_past.values())

    def seq_pos_max(self, seq: int) -> int:
        return self.n_past.get(seq, 0) - 1

    def seq_cells(self, seq: int) -> torch.Tensor:
        return torch.arange(self.n_past.get(seq, 0), device="cpu")

    def clear(self) -> None:
        self.caches.clear()
        self.n_past.clear()
        self.n_last.clear()
        self.rs_trace.clear()

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove [p0, p1). Only a whole sequence or a tail the layers can still give back; False otherwise."""
        if seq < 0:
            if p0 > 0 or p1 >= 0:
                return False
            self.clear()
            return True
        n = self.n_past.get(seq, 0)
        if p1 >= 0 and p1 < n:
            return False  # a hole in the middle of a recurrent history is meaningless
        if p0 <= 0:
            self.caches.pop(seq, None)
            self.n_past.pop(seq, None)
            self.n_last.pop(seq, None)
            self.rs_trace.pop(seq, None)
            return True
        n_remove = n - p0
        if n_remove <= 0:
            return True
        if n_remove > self.n_rs(seq):
            return False
        trace = self.rs_trace.pop(seq, None) or {}
        with torch.inference_mode():
            for idx, layer in enumerate(self.caches[seq].layers):
                layer.crop(-n_remove)
                if idx in trace:
                    layer.recurrent_states[0].copy_(trace[idx][-1 - n_remove])
        self.n_past[seq] = p0
        self.n_last[seq] = 0  # crop also dropped the recorded past: nothing more can be given back
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        raise ValueError("a recurrent memory cannot share a prefix between sequences")

    # ---- reversible state and checkpoints -----------------------------------------------------------------

    def n_rs(self, seq: int) -> int:
        """How many tail tokens of `seq` can be removed now (0 when a recurrent state is in the way)."""
        cache = self.caches.get(seq)
        if cache is None:
            return 0
        n = self.n_last.get(seq, 0)
        for idx, layer in enumerate(cache.layers):
            if isinstance(layer, LinearAttentionCacheLayerMixin) and any(layer.is_recurrent_states_initialized.values()):
                states = self.rs_trace.get(seq, {}).get(idx)
                n = min(n, len(states) - 1 if states else 0)
        return n

    @torch.inference_mode()  # the states are inference tensors: copying into them must happen in this mode too
    def state_save(self, seq: int):
        """What a replay cannot rebuild: recurrent/conv states and sliding K/V, copied; attention lengths."""
        cache = self.caches.get(seq)
        saved = []
        for layer in cache.layers if cache is not None else []:
            entry = {}
            if isinstance(layer, LinearAttentionCacheLayerMixin):
                entry["conv"] = {i: s.clone() for i, s in layer.conv_states.items() if s is not None}
                entry["rec"] = {i: s.clone() for i, s in layer.recurrent_states.items() if s is not None}
                entry["prev"] = dict(layer.has_previous_state)
            if isinstance(layer, DynamicSlidingWindowLayer) and layer.is_initialized:
                entry["kv"] = (layer.keys.clone(), layer.values.clone(), layer.cumulative_length)
            elif isinstance(layer, DynamicLayer):
                entry["len"] = layer.get_seq_length()
            saved.append(entry)
        return {"n_past": self.n_past.get(seq, 0), "n_last": self.n_last.get(seq, 0), "layers": saved}

    @torch.inference_mode()
    def state_restore(self, seq: int, saved, n_tokens: int) -> None:
        """Put `seq` back as state_save found it (n_tokens is the checkpoint's length, for the cell cache)."""
        if saved["n_past"] == 0:
            self.seq_rm(seq, -1, -1)
            return
        for layer, entry in zip(self.caches[seq].layers, saved["layers"]):
            if "conv" in entry:
                for i, s in entry["conv"].items():
                    layer.conv_states[i] = s.clone()
                for i, s in entry["rec"].items():
                    layer.recurrent_states[i].copy_(s)
                layer.has_previous_state.update(entry["prev"])
            if "kv" in entry:
                keys, values, layer.cumulative_length = entry["kv"]
                layer.keys, layer.values = keys.clone(), values.clone()
            elif "len" in entry and layer.is_initialized:
                layer.crop(-(layer.get_seq_length() - entry["len"]))
        self.n_past[seq] = saved["n_past"]
        self.n_last[seq] = saved["n_last"]
        self.rs_trace.pop(seq, None)  # the recorded states belong to the forward being undone


class StatefulContext:
    """Runs batches of (token, pos, seq) rows through a model on its own per-sequence caches."""

    def __init__(self, model, n_ctx: int, n_seq_max: int = 1, n_outputs_max: int | None = None, n_rs: int = 0):
        cfg = model.config
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        self.model = model
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.n_outputs_max = n_outputs_max
        self.n_vocab = int(text_cfg.vocab_size)
        self.device = next(model.parameters()).device
        self.cache = StateMemory()
        self.lean = None  # transformers' own forward, on the model's own per-sequence cache (engine/forward/lean.py)
        self.lean_reason = "a recurrent or hybrid model runs transformers' forward on its own cache"
        self.n_forward = 0
        # a recurrent state holds one history per sequence: a tree's branches would need a state each
        self.supports_trees = False
        self.hidden_layers: tuple[int, ...] = ()  # as ModelContext.hidden_layers
        # n_rs > 0: step the recurrent mixers and keep their last n_rs states, so short tails can be removed (RS)
        self.recorder = StepRecorder(model, n_rs) if n_rs > 0 else None
        if self.recorder is not None and self.recorder.n_layers:
            self.cache.rs_limit = n_rs

    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        for layer in cache.layers:
            # keep what the next forward adds until we know how much of it stays: RS for conv and window layers
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()
        return cache

    @torch.inference_mode()
    def decode(self, batch: Batch) -> DecodeResult:
        check_batch(batch, self.n_outputs_max)
        by_seq: dict[int, list[int]] = {}
        for i, s in enumerate(batch.seq):
            by_seq.setdefault(s, []).append(i)
        for s, rows in by_seq.items():
            if not 0 <= s < self.n_seq_max:
                raise ValueError(f"sequence id out of range [0, {self.n_seq_max})")
            n = self.cache.n_past.get(s, 0)
            if [batch.pos[i] for i in rows] != list(range(n, n + len(rows))):
                raise ValueError(f"sequence {s}: positions must continue its memory at {n}, in order")
        if self.cache.n_used() + len(batch) > self.n_ctx:
            raise RuntimeError(f"memory full: {len(batch)} new tokens, {self.n_ctx - self.cache.n_used()} free")
        synchronize_model(self.model)  # on a card: time this forward's work, not what was queued before
        t0 = time.perf_counter()
        logits = [None] * len(batch)
        hidden = [None] * len(batch)
        for s, rows in by_seq.items():
            out = self._forward(s, [batch.tokens[i] for i in rows])
            for j, i in enumerate(rows):
                logits[i] = out.logits[0, j]
                if self.hidden_layers:
                    hidden[i] = torch.cat([out.hidden_states[k][0, j] for k in self.hidden_layers], dim=-1)
        self.n_forward += 1
        out_rows = batch.output_rows()
        synchronize_model(self.model)
        return DecodeResult(
            logits=(torch.stack([logits[i] for i in out_rows]).float() if out_rows
                    else torch.empty(0, self.n_vocab, device=self.device)),
            seconds=time.perf_counter() - t0,
            hidden=torch.stack(hidden).float() if self.hidden_layers else None,
            layers=tuple(self.hidden_layers),
        )

    def _forward(self, seq: int, tokens: list[int]):
        cache = self.cache.caches.get(seq)
        if cache is None:
            cache = self.cache.caches[seq] = self._new_cache()
        elif self.cache.n_last.get(seq):
            for layer in cache.layers:  # the last forward is settled: drop the past it recorded
                if getattr(layer, "record_past", False) and _initialized(layer):
                    layer.crop(0)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        if self.recorder is not None:
            self.recorder.begin(len(tokens))
        try:
            out = self.model(input_ids=ids, cache=cache, use_cache=True,
                             output_hidden_states=bool(self.hidden_layers))
        except Exception:
            self.cache.seq_rm(seq, -1, -1)  # a half-updated state is worthless: the sequence starts over
            raise
        finally:
            trace = self.recorder.end() if self.recorder is not None else None
        if trace:
            self.cache.rs_trace[seq] = trace
        else:
            self.cache.rs_trace.pop(seq, None)
        self.cache.n_past[seq] = self.cache.n_past.get(seq, 0) + len(tokens)
        self.cache.n_last[seq] = len(tokens)
        return out

    def describe_forward(self) -> str:
        return f"transformers' forward ({self.lean_reason})"

    def seq_rm(self, seq: int, p0: int = -1, p1: int = -1) -> bool:
        return self.cache.seq_rm(seq, p0, p1)

    def clear(self) -> None:
        self.cache.clear()


def _initialized(layer) -> bool:
    if isinstance(layer, LinearAttentionCacheLayerMixin):
        return all(layer.conv_states[i] is not None for i in range(layer.number_of_states))
    return bool(getattr(layer, "is_initialized", False))


def has_own_state(model) -> bool:
    """Whether the model keeps layers the cell cache cannot hold (recurrent or conv state)."""
    try:
        cache = DynamicCache(config=model.config)
    except (TypeError, ValueError, AttributeError, KeyError):
        return False  # a config the generic cache does not understand: try the cell cache, the probe will tell
    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers)
