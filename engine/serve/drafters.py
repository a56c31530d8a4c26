"""What each drafter is built from: a small context value that the engine fills once (the draft model and its
cache size, the target whose embeddings and hidden states a head reads, the parameters the caller gave). The
drafters themselves know nothing of the engine; this is where the two meet."""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.draft.base import Drafter
from engine.draft.registry import make_drafter
from engine.load.errors import VocabMismatchError
from engine.load.models import check_vocab_compatible


@dataclass(frozen=True)
class DrafterContext:
    target: object  # the target's LoadedModel: a head reads its embeddings and hidden states
    draft_model: object | None  # the loaded draft model's LoadedModel, or None
    draft_mismatch: str | None  # why the draft model's vocabulary is not the target's (None: it is, or no model)
    n_ctx: int  # the engine's cache: a draft model's cache is as large
    n_seq_max: int
    n_vocab: int  # the target's vocabulary: draft-simple proposes only its ids
    params: dict  # type name -> its params dataclass (Engine.drafter_params)


def vocab_mismatch(target, draft) -> str | None:
    """Why the draft model's vocabulary is not the target's; None where it is, or there is no draft model."""
    if draft is not None:
        try:
            check_vocab_compatible(target, draft)
        except VocabMismatchError as e:
            return str(e)
    return None


def build_drafter(ctx: DrafterContext, name: str) -> Drafter:
    """The drafter `name`, built for the engine `ctx` describes: ValueError where the loaded models cannot serve
    it."""
    return make_drafter(name, **drafter_kwargs(ctx, name))


def drafter_kwargs(ctx: DrafterContext, name: str) -> dict:
    """Keyword arguments for make_drafter(name)."""
    given = ctx.params.get(name)
    if name in ("draft-simple", "draft-uni"):
        return _draft_model_kwargs(ctx, name, given)
    if name == "draft-head":
        from engine.draft.head.drafter import DraftHeadParams

        # the head reads the target's embeddings and hidden states
        return dict(target=ctx.target, params=given or DraftHeadParams())
    if name == "draft-eagle3":
        from engine.draft.head.eagle3 import Eagle3Params

        # its checkpoint directory comes in its params; it reads the target's hidden states
        return dict(target=ctx.target, params=given or Eagle3Params())
    if name == "draft-mtp":
        from engine.draft.mtp import MtpParams

        # the target's own layers; each layer's cache as large as the engine's
        params = replace(given or MtpParams(), n_ctx=ctx.n_ctx, n_seq_max=ctx.n_seq_max)
        return dict(target=ctx.target, params=params)
    if name in ("draft-dflash", "draft-dspark"):
        from engine.draft.dflash import DFlashParams

        # its checkpoint comes in its params; its context entries as many as the engine's cells
        params = replace(given or DFlashParams(), n_ctx=ctx.n_ctx, n_seq_max=ctx.n_seq_max)
        return dict(target=ctx.target, params=params)
    return dict(params=given) if given is not None else {}


def _draft_model_kwargs(ctx: DrafterContext, name: str, given) -> dict:
    """A draft model's drafter: its cache as large as the engine's; draft-simple proposes only the target's ids,
    draft-uni goes through text with both tokenizers."""
    from engine.draft.draft_model import DraftModelParams

    if ctx.draft_model is None:
        raise ValueError(f"{name} needs a draft model: load one first")
    if name == "draft-simple" and ctx.draft_mismatch is not None:
        raise ValueError(f"draft-simple needs a draft model with the target's vocabulary, and this one's differs "
                         f"({ctx.draft_mismatch}): use draft-uni, which drafts through text")
    model = DraftModelParams(n_ctx=ctx.n_ctx, n_seq_max=ctx.n_seq_max,
                             n_vocab=ctx.n_vocab if name == "draft-simple" else None)
    if name == "draft-simple":
        return dict(model=ctx.draft_model.model, params=model)
    from engine.draft.draft_uni import DraftUniParams

    # the cache's size follows the engine's; the rest may be given (drafter_params)
    params = replace(given or DraftUniParams(), model=model)
    return dict(model=ctx.draft_model.model, draft_tokenizer=ctx.draft_model.tokenizer,
                target_tokenizer=ctx.target.tokenizer, params=params)
