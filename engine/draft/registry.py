"""Which drafters exist, by the names users and the bench give them, and how one is built: the table of
llama.cpp's common_speculative types (plus ours), in its priority order, our defaults where they differ, and
the parsing of a chain written as 'ngram-simple,draft-head'."""

from __future__ import annotations

import importlib

from engine.draft.base import Drafter

# type name -> (module, class), in llama.cpp's priority order
DRAFTER_TYPES: dict[str, tuple[str, str]] = {
    # the grammar's forced tokens (a constrained generation only): certain, so asked before any guess
    "grammar": ("engine.draft.grammar", "GrammarDrafter"),
    "ngram-simple": ("engine.draft.ngram", "NgramSimple"),
    "ngram-map-k": ("engine.draft.ngram", "NgramMapK"),
    "ngram-map-k4v": ("engine.draft.ngram", "NgramMapK4V"),
    "ngram-mod": ("engine.draft.ngram_mod", "NgramMod"),
    "ngram-cache": ("engine.draft.ngram_cache", "NgramCache"),
    "draft-simple": ("engine.draft.draft_model", "DraftModelDrafter"),
    "draft-head": ("engine.draft.head.drafter", "DraftHeadDrafter"),  # the trained EAGLE-style head
    # a published EAGLE-3 head (the EAGLE authors' or speculators' checkpoint layout), given as --draft DIR
    "draft-eagle3": ("engine.draft.head.eagle3", "Eagle3Drafter"),
    # the target's own multi-token-prediction layers (DeepSeek-V3's NextN), where its checkpoint has them
    "draft-mtp": ("engine.draft.mtp", "MtpDrafter"),
    # block drafters: a whole block from the target's features in one forward (DFlash; DSpark adds a Markov
    # head), the checkpoint given as --draft DIR or FILE.gguf
    "draft-dflash": ("engine.draft.dflash", "DFlashDrafter"),
    "draft-dspark": ("engine.draft.dflash", "DSparkDrafter"),
    # a draft model of another vocabulary, drafting through text (engine/draft/draft_uni.py)
    "draft-uni": ("engine.draft.draft_uni", "DraftUniDrafter"),
    # not a real drafter: full-length drafts for synthetic-acceptance measurements (SpecParams.synthetic_accept)
    "synthetic": ("engine.draft.synthetic", "SyntheticDrafter"),
    # not a real drafter either: the answer a measurement already knows (SpecParams.reference), the arena's ceiling
    "oracle": ("engine.draft.oracle", "OracleDrafter"),
}
PRIORITY = [t for t in DRAFTER_TYPES if t not in ("synthetic", "oracle")]  # what a user picks from


def default_params() -> dict:
    """Our defaults where they differ from llama.cpp's. Its 12-token keys (24 for ngram-mod, with 48-token
    minimum drafts) suit long code-editing sessions; a chat answer that copies a paragraph realigns with its
    source after every small change, and a 3-token key finds the source again within a few tokens; ngram-simple
    then tries 2- and 1-token keys, which find it one token after the change (both measured:
    docs/history.md#the-n-gram-keys).
    Drafts that do not pay are cut by the length policy, not by long keys."""
    from engine.draft.ngram import NgramMapParams, NgramSimpleParams
    from engine.draft.ngram_mod import NgramModParams

    return {
        "ngram-simple": NgramSimpleParams(size_n=3, size_m=48, size_n_min=1),
        "ngram-map-k": NgramMapParams(size_n=3, size_m=48),
        "ngram-map-k4v": NgramMapParams(size_n=3, size_m=48),
        "ngram-mod": NgramModParams(n_match=8, n_min=2, n_max=64),
    }
NGRAM_CHAIN = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]


def parse_types(spec: str | list[str] | None) -> list[str]:
    """'ngram-simple,draft-simple' -> known names in the user's order; 'none' or empty -> []."""
    if spec is None:
        return []
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    names = [n for n in names if n != "none"]
    unknown = [n for n in names if n not in DRAFTER_TYPES]
    if unknown:
        raise ValueError(f"unknown drafter type(s) {', '.join(unknown)}; known: {', '.join(PRIORITY)}")
    return list(dict.fromkeys(names))


NGRAMS = "n-grams"  # the gate's name for a slot's n-gram drafters taken together


def is_ngram(name: str) -> bool:
    return name.startswith("ngram-")


def make_drafter(name: str, **kwargs) -> Drafter:
    module, cls = DRAFTER_TYPES[name]
    return getattr(importlib.import_module(module), cls)(**kwargs)


def starting_chain(target) -> list[str]:
    """The chain a page and the arena start with: the n-gram drafters, then the trained head where it fits the
    target. The head pays on open prompts, where the n-grams find nothing to copy, and after the n-grams it was the
    fastest chain on open and copy prompts alike (docs/measured.md#speed-of-the-head-in-chains). A target that
    carries its own MTP layers drafts with them last (draft-mtp): they were trained with it."""
    from engine.draft.head.drafter import head_fits  # torch and the head's config: only when asked
    from engine.load.mtp import mtp_reason

    own = getattr(target, "model", None) is not None and mtp_reason(target) is None
    return list(NGRAM_CHAIN) + (["draft-head"] if head_fits(target) else []) + (["draft-mtp"] if own else [])
