"""Speculative-decoding engine: llama.cpp-style drafting and verification on HF transformers models.

This package's face: what the page, the bench and the scripts use, each name imported from where it lives on
first use (PEP 562), so `import engine` loads nothing heavy. The layers, lowest first: the vocabulary in this
folder (params, events, batch, sampling, grammar, prefix), `forward/`, `memory/`, `load/`, `cost/`, `draft/`,
`round/`, `serve/`, `remote/` (another server seen over HTTP), and the bench (`bench/`) on top.
"""

from __future__ import annotations

import importlib

_FACE = {  # public name -> (module, its name there)
    # requests and what comes back
    "GenParams": ("engine.params", "GenParams"),
    "SpecParams": ("engine.params", "SpecParams"),
    "SamplerParams": ("engine.sampling", "SamplerParams"),
    "GrammarSpec": ("engine.grammar", "GrammarSpec"),
    "ErrorEvent": ("engine.events", "ErrorEvent"),
    "WaitEvent": ("engine.events", "WaitEvent"),
    "RoundEvent": ("engine.events", "RoundEvent"),
    # serving
    "Engine": ("engine.serve.engine", "Engine"),
    "EngineView": ("engine.serve.engine_view", "EngineView"),  # what the page reads of an Engine (a Protocol)
    "Scheduler": ("engine.serve.scheduler", "Scheduler"),
    "QueueFull": ("engine.serve.requests", "QueueFull"),
    "SpecCounters": ("engine.serve.metrics", "SpecCounters"),
    "MEASUREMENTS": ("engine.serve.metrics", "MEASUREMENTS"),  # purposes counted apart from the answers
    # models
    "load_model": ("engine.load.models", "load_model"),
    "ModelLoadError": ("engine.load.models", "ModelLoadError"),
    "VocabMismatchError": ("engine.load.models", "VocabMismatchError"),
    "DTYPE_CHOICES": ("engine.load.dtype", "CHOICES"),
    "DEVICE_HELP": ("engine.forward.device", "DEVICE_HELP"),
    "packaged_names": ("engine.load.packaged", "packaged_names"),  # models PyPI packages ship, by short name
    "linear_paths": ("engine.forward.prepack", "linear_paths"),
    # drafters and their counters
    "NGRAM_CHAIN": ("engine.draft.registry", "NGRAM_CHAIN"),
    "PRIORITY": ("engine.draft.registry", "PRIORITY"),
    "DraftHeadParams": ("engine.draft.head.drafter", "DraftHeadParams"),
    "DraftModelParams": ("engine.draft.draft_model", "DraftModelParams"),
    "head_fits": ("engine.draft.head.drafter", "head_fits"),
    "starting_chain": ("engine.draft.registry", "starting_chain"),
    "Eagle3Params": ("engine.draft.head.eagle3", "Eagle3Params"),
    "is_eagle3_dir": ("engine.load.eagle3", "is_eagle3_dir"),
    "DFlashParams": ("engine.draft.dflash", "DFlashParams"),
    "dflash_kind": ("engine.load.dflash", "dflash_kind"),
    "DrafterStats": ("engine.draft.stats", "DrafterStats"),
    "stats_from_events": ("engine.draft.stats", "stats_from_events"),
    # the advisor: what chain would pay most for a prompt here (engine/bench/advice.py)
    "Advice": ("engine.bench.advice", "Advice"),
    "advise": ("engine.bench.advice", "advise"),
    "anchor": ("engine.bench.advice", "anchor"),
    "chain_tokens": ("engine.bench.advice", "chain_tokens"),
    "decode_seconds": ("engine.bench.advice", "decode_seconds"),
    # the bench: its traces, figures and a live run
    "FIGURES": ("engine.bench.plot", "FIGURES"),
    "figures": ("engine.bench.plot", "figures"),
    "load_rows": ("engine.bench.rows", "load_rows"),
    "write_rows": ("engine.bench.rows", "write_rows"),
    "sweep_summary": ("engine.bench.stats", "sweep_summary"),
    "speedup_formula": ("engine.bench.stats", "formula"),
    # this machine's forward by rows beside the weights' memory-bound floor (engine/cost/roofline.py)
    "roofline": ("engine.cost.roofline", "roofline"),
    "LiveBenchError": ("engine.bench.live", "LiveBenchError"),
    "LivePlan": ("engine.bench.live", "LivePlan"),
    "run_live": ("engine.bench.live", "run_live"),
    # the drafter arena: every drafter, the chain and an oracle on one prompt, ranked (engine/bench/contest.py)
    "ArenaParams": ("engine.bench.contest", "ArenaParams"),
    "run_arena": ("engine.bench.contest", "run_arena"),
    "scheduler_runner": ("engine.bench.contest", "scheduler_runner"),
    # same distribution? N speculative and N plain answers' token at one position, with a chi-square test
    "SameDistPlan": ("engine.bench.samedist", "SameDistPlan"),
    "compare_distributions": ("engine.bench.samedist", "compare"),
    "group_runner": ("engine.bench.samedist", "scheduler_runner"),
    "ARENA_COLUMNS": ("engine.bench.leaderboard", "COLUMNS"),
    "ARENA_POSITIONS": ("engine.bench.leaderboard", "N_POSITIONS"),
    "arena_leaderboard": ("engine.bench.leaderboard", "leaderboard"),
    "write_arena_csv": ("engine.bench.leaderboard", "write_csv"),
    "write_arena_png": ("engine.bench.leaderboard", "write_png"),
    # another server seen over HTTP: its answer, its counters' change, what it runs (engine/remote/)
    "RemoteClient": ("engine.remote.client", "RemoteClient"),
    "RemoteConfig": ("engine.remote.client", "RemoteConfig"),
    "RemoteError": ("engine.remote.client", "RemoteError"),
    "read_server_info": ("engine.remote.observe", "read_server_info"),
    "observe": ("engine.remote.observe", "observe"),
    "plain_answer": ("engine.remote.observe", "plain_answer"),
    "Observation": ("engine.remote.observe", "Observation"),
    "RemoteAnswer": ("engine.remote.client", "RemoteAnswer"),
    "NOT_SHOWN": ("engine.remote.observe", "NOT_SHOWN"),  # what a server keeps to itself, in words
    "read_remote": ("engine.remote.reading", "read_remote"),
    # the colours, axes and layout the bench's plots and the page's charts share (the module itself)
    "plotstyle": ("engine.plotstyle", None),
}

__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name not in _FACE:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    # looked up at each use, not kept here: a name patched where it lives (a test's monkeypatch) is the one
    # the page then gets; the module itself is imported once, like any import
    module, attr = _FACE[name]
    value = importlib.import_module(module)
    return value if attr is None else getattr(value, attr)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FACE))
