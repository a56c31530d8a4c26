"""Reversible state for recurrent layers (llama.cpp's RS memory, `llama_n_rs_seq`): keep the state after each of the last
n_rs tokens of a forward, so a rejected tail of up to n_rs tokens is undone by putting one state back.

transformers' scan kernels return only the final recurrent state of a multi-token forward. To have the state
after every draft token, the recurrent mixers of the model are stepped one token at a time inside the one
forward of the verification batch (attention, MLPs and norms still see the whole batch at once), and a clone of
the recurrent state is kept after each step. That is llama.cpp's ssm kernels writing intermediate states, done
in Python. Cost: a mixer step per token instead of one scan, and n_rs state copies per layer; in exchange a
short rejection needs no checkpoint restore and no replay forward. A longer one falls back to the checkpoint.

Stepping also makes a model whose multi-token scan on a non-empty cache is wrong (Mamba v1 in transformers)
verifiable in one forward, since one-token steps are its exact decoding path.
"""

from __future__ import annotations

import types

import torch

MAX_STEPPED = 64  # a longer forward (a prompt) runs the normal scan and keeps no states: nothing to undo there


class StepRecorder:
    """Wraps a model's recurrent mixers; while `on`, records the recurrent state after each token per layer."""

    def __init__(self, model, n_rs: int):
        self.n_rs = n_rs  # states kept per layer: the longest tail that can be removed without a checkpoint
        self.on = False  # set by the context around a forward that may be rolled back
        self.trace: dict[int, list[torch.Tensor]] = {}  # layer index -> states after the last tokens, oldest first
        self.n_layers = 0
        for module in model.modules():
            if hasattr(module, "layer_idx") and hasattr(module, "conv1d") and hasattr(module, "A_log"):
                self._wrap(module)
                self.n_layers += 1

    def _wrap(self, mixer) -> None:
        scan = mixer.forward
        recorder = self

        def forward(self, hidden_states, *args, cache=None, attention_mask=None, **kwargs):
            if not recorder.on or cache is None:
                return scan(hidden_states, *args, cache=cache, attention_mask=attention_mask, **kwargs)
            outs = []
            for t in range(hidden_states.shape[1]):
                outs.append(scan(hidden_states[:, t:t + 1], *args, cache=cache, attention_mask=None, **kwargs))
                recorder._keep(mixer.layer_idx, cache)
            return torch.cat(outs, dim=1)

        mixer.forward = types.MethodType(forward, mixer)

    def _keep(self, layer_idx: int, cache) -> None:
        states = self.trace.setdefault(layer_idx, [])
        states.append(cache.layers[layer_idx].recurrent_states[0].clone())
        del states[: -(self.n_rs + 1)]

    def begin(self, n_tokens: int) -> bool:
        """Before a forward: record if it is short enough to be a verification. Returns whether it records."""
        self.trace = {}
        self.on = self.n_layers > 0 and self.n_rs > 0 and n_tokens <= MAX_STEPPED
        return self.on

    def end(self) -> dict[int, list[torch.Tensor]] | None:
        """After the forward: the states it recorded (None if it did not record)."""
        trace = self.trace if self.on else None
        self.on = False
        self.trace = {}
        return trace
