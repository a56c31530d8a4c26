"""Where a model runs: the `--device` flag of app.py, the bench and the arena, read once and checked.

`cpu`, `cuda` (the current card, or every card under accelerate's device map), `cuda:N` (that card) or `auto`
(`cuda` where torch sees a card, else `cpu`). Nothing picks a card unless the flag says so: a library caller that
names no device gets the CPU. Timings read on a card wait for its queued work first (`synchronize`), since a CUDA
call returns before the card has done it; on the CPU that wait costs nothing and is skipped.
"""

from __future__ import annotations

import re

DEVICE_CHOICES = "cpu, cuda, cuda:N or auto"
DEVICE_HELP = ("where the models run: cpu, cuda (accelerate's device map over the cards where it is installed), "
               "cuda:N (that card) or auto (cuda where torch sees one, else cpu); default auto")


def resolve_device(text: str | None) -> str:
    """The device `text` names, checked against this machine. Raises ValueError naming the flag."""
    import torch

    name = (text or "auto").strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    found = re.fullmatch(r"cuda(?::(\d+))?", name)
    if found is None:
        raise ValueError(f"--device must be {DEVICE_CHOICES}, got {text!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {name}: torch sees no CUDA device on this machine "
                             f"(torch {torch.__version__}); use --device cpu")
    index = int(found.group(1)) if found.group(1) is not None else None
    if index is not None and index >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return name


def model_device(model):
    """The device a model's first parameter is on (its embedding, where inputs go); the CPU for a model with none."""
    import torch

    param = next(iter(model.parameters()), None)
    return param.device if param is not None else torch.device("cpu")


def synchronize(device) -> None:
    """Wait until `device` has run the work queued on it, so a clock read after it times that work. Free on the
    CPU, whose calls return when done."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synchronize_model(model) -> None:
    """`synchronize` on every card a model's weights are on (a device map may spread them over several)."""
    import torch

    if not torch.cuda.is_initialized():  # no card in use: nothing queued (and no walk over every parameter per forward)
        return
    cards = {p.device for p in model.parameters() if p.device.type == "cuda"}
    for card in cards:
        torch.cuda.synchronize(card)
