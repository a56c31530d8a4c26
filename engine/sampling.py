"""The target's sampler chain (temperature, top-k, top-p, min-p) with its own random stream.

A sampler draws exactly one uniform number per sampled token (inverse CDF), so plain decoding and
sample-and-match verification consume the stream identically and give the same text for the same seed. The
stream is a CPU generator whatever device the logits are on: a uniform is one host number, and the same seed
gives the same text on a card as on the CPU (up to the logits' own rounding).
`clone()` / `copy_from()` let a rollback restore the stream together with the cache.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's first maximum (the last dimension), as torch.argmax gives it, NaN counting as the largest in
    both. numpy's argmax is vectorised and, over a vocabulary's logits, much cheaper than torch's call
    (docs/history.md#a-forwards-and-a-rounds-fixed-costs), and a round with four slots takes four of them."""
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64) or logits.requires_grad:
        return logits.argmax(dim=-1).reshape(-1).tolist()
    return logits.numpy().argmax(axis=-1).reshape(-1).tolist()


def entropy_bits(logits: torch.Tensor) -> list[float]:
    """Each row's entropy in bits under the model's own softmax (temperature 1, no cut): how unsure the target
    is at that place, whatever the sampler then does with it. logits: [n, V]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    h = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(dim=-1) / 0.6931471805599453
    return h.reshape(-1).tolist()


SEED_LIMIT = 2 ** 63  # seeds below it stay below 2^64 after the drafters' XOR with their own mix, as manual_seed needs
# a temperature below it is greedy (vLLM's _SAMPLING_EPS): dividing logits by 1e-40 overflows to inf, softmax to NaN
GREEDY_BELOW = 1e-5


@dataclass
class SamplerParams:
    temp: float = 0.0  # 0 = greedy (argmax); > 0 divides the logits
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p; 1 = off
    min_p: float = 0.0  # drop tokens below min_p * p(top token); 0 = off
    seed: int = 0  # seed of this sampler's own torch.Generator

    def __setattr__(self, name, value) -> None:
        # every reader (sampler, verifiers, drafters) tests `temp > 0`: snapping here, on construction and on
        # every later assignment, makes all of them agree that a tiny temperature is greedy
        if name == "temp" and isinstance(value, (int, float)) and 0.0 < value < GREEDY_BELOW:
            value = 0.0
        object.__setattr__(self, name, value)

    def validate(self) -> None:
        # comparisons alone let NaN through (every one of them is False), and a NaN temperature makes every
        # probability NaN: each bound is written so that NaN fails it
        if not 0.0 <= self.temp < math.inf:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temp}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1), got {self.min_p}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < SEED_LIMIT:
            raise ValueError(f"seed must be an integer in [0, 2^63), got {self.seed}")


class Sampler:
    def __init__(self, params: SamplerParams):
        params.validate()
        self.params = params
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(params.seed)
        self.n_draws = 0  # uniform numbers drawn so far, for tests and the UI

    @property
    def greedy(self) -> bool:
        return self.params.temp <= 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Distribution after the chain. logits: [..., V] -> probs [..., V] (one-hot at temp 0)."""
        logits = logits.float()
        if self.greedy:
            out = torch.zeros_like(logits)
            out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)  # the first maximum, as argmax_rows
            return out
        p = self.params
        logits = logits / p.temp
        if p.top_k > 0 and p.top_k < logits.shape[-1]:
            kth = torch.topk(logits, p.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.min_p > 0.0:
            top = probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < p.min_p * top, 0.0)
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
            before = torch.cumsum(sorted_p, dim=-1) - sorted_p
            sorted_p = sorted_p.masked_fill(before >= p.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        return probs / probs.sum(dim=-1, keepdim=True)

    def uniform(self) -> float:
        """One draw from this sampler's stream."""
        self.n_draws += 1
        return float(torch.rand((), generator=self.generator, device="cpu"))

    def sample_probs(self, probs: torch.Tensor) -> int:
        """Inverse-CDF draw from an (unnormalised) distribution [V]: one uniform per token."""
        cdf = torch.cumsum(probs.double(), dim=-1)
        u = self.uniform() * float(cdf[-1])
        idx = int(torch.searchsorted(cdf, torch.tensor([u], dtype=cdf.dtype, device=cdf.device), right=True)[0])
        idx = min(idx, probs.shape[-1] - 1)
        while probs[idx] <= 0 and idx > 0:  # u landed on a zero-width step at the top end
            idx -= 1
        return idx

    def sample(self, logits: torch.Tensor) -> int:
        """Sample one token from logits [V]. Greedy draws nothing from the stream."""
        if self.greedy:
            return argmax_rows(logits)[0]
        return self.sample_probs(self.probs(logits))

    def clone(self) -> "Sampler":
        other = Sampler.__new__(Sampler)
        other.params = copy.copy(self.params)
        other.generator = torch.Generator(device="cpu")
        other.generator.set_state(self.generator.get_state())
        other.n_draws = self.n_draws
        return other

    def copy_from(self, other: "Sampler") -> None:
        """Restore this sampler to `other`'s state (rollback)."""
        self.params = copy.copy(other.params)
        self.generator.set_state(other.generator.get_state())
        self.n_draws = other.n_draws
