"""What each drafter is built from, given the engine that serves it: the draft model and its cache size, the
target whose embeddings and hidden states a head reads, the parameters the caller gave (Engine.drafter_params).
The drafters themselves know nothing of the engine; this is where the two meet."""

from __future__ import annotations

from dataclasses import replace


def drafter_kwargs(engine, name: str) -> dict:
    """Keyword arguments for make_drafter(name): ValueError where the loaded models cannot serve it."""
    given = engine.drafter_params.get(name)
    if name in ("draft-simple", "draft-uni"):
        return _draft_model_kwargs(engine, name, given)
    if name == "draft-head":
        from engine.draft.draft_head import DraftHeadParams

        # the head reads the target's embeddings and hidden states
        return dict(target=engine.target, params=given or DraftHeadParams())
    if name == "draft-eagle3":
        from engine.draft.draft_eagle3 import Eagle3Params

        # its checkpoint directory comes in its params; it reads the target's hidden states
        return dict(target=engine.target, params=given or Eagle3Params())
    return dict(params=given) if given is not None else {}


def _draft_model_kwargs(engine, name: str, given) -> dict:
    """A draft model's drafter: its cache as large as the engine's; draft-simple proposes only the target's ids,
    draft-uni goes through text with both tokenizers."""
    from engine.draft.draft_model import DraftModelParams

    if engine.draft_model is None:
        raise ValueError(f"{name} needs a draft model: load one first")
    if name == "draft-simple" and engine.draft_mismatch is not None:
        raise ValueError(f"draft-simple needs a draft model with the target's vocabulary, and this one's differs "
                         f"({engine.draft_mismatch}): use draft-uni, which drafts through text")
    model = DraftModelParams(n_ctx=engine.ctx.n_ctx, n_seq_max=engine.ctx.n_seq_max,
                             n_vocab=engine.ctx.n_vocab if name == "draft-simple" else None)
    if name == "draft-simple":
        return dict(model=engine.draft_model.model, params=model)
    from engine.draft.draft_uni import DraftUniParams

    # the cache's size follows the engine's; the rest may be given (drafter_params)
    params = replace(given or DraftUniParams(), model=model)
    return dict(model=engine.draft_model.model, draft_tokenizer=engine.draft_model.tokenizer,
                target_tokenizer=engine.target.tokenizer, params=params)
