"""Loading models from the UI: a new target (or draft) means a new Engine and Scheduler.

The weights load beside the running engine, which goes on serving; then the load waits its turn in the old
engine's command queue, which ends the answers in flight with a message and builds the new engine on its own
thread, so the new engine's cost calibration times forwards on a quiet machine. A failed load keeps what was
loaded."""

from __future__ import annotations

from ui.presets import PROBE_PROMPT, probe_model_drafters, probe_trees
from ui.session import UserError
from ui.settings import default_chain, full_chain
from ui.state import AppOptions, AppState, Runtime
from ui.tokens import Vocab

NO_DRAFT = ("", "none")


def make_runtime(target, draft, options: AppOptions, on_event=None) -> Runtime:
    """Engine + Scheduler for these models; on_event hears every round (AppState.counters.observe). Raises
    VocabMismatchError (a ValueError) for an unusable draft."""
    from pathlib import Path

    from engine import Eagle3Params, Engine, Scheduler

    params = {"draft-eagle3": Eagle3Params(weights=Path(options.eagle3))} if options.eagle3 else {}
    if getattr(options, "dflash", None):
        from engine import DFlashParams, dflash_kind

        params[dflash_kind(options.dflash)] = DFlashParams(weights=Path(options.dflash))
    engine = Engine(target, draft, n_ctx=options.n_ctx, n_seq_max=options.parallel, n_rs=options.n_rs,
                    fair=options.budget == "fair", threads=options.threads, drafter_params=params,
                    n_ctx_seq=options.ctx_per_slot)
    runtime = Runtime(target=target, draft=draft, engine=engine, scheduler=None, vocab=Vocab.of(target.tokenizer),
                      roofline=measure_roofline(target, engine))
    # before its scheduler starts: the probe drafts on the engine directly, with nobody else on it
    runtime.left_out = probe_model_drafters(engine, target.encode_chat([{"role": "user", "content": PROBE_PROMPT}]),
                                            full_chain(runtime, options.eagle3), runtime.roofline)
    runtime.trees = probe_trees(engine, target, default_chain(runtime, options.eagle3))
    runtime.scheduler = Scheduler(engine, options.queue_max, on_event=on_event)
    return runtime


def measure_roofline(target, engine):
    """The calibrated curve beside the weights' memory-bound floor (a copy timed now); None where the engine
    timed no curve (a model that cannot speculate)."""
    from engine import roofline

    cost = engine.cost
    if not engine.probe.can_speculate or len(cost.sizes) < 2:
        return None
    return roofline(target.model, list(cost.sizes), list(cost.seconds))


def clean_name(name: str | None) -> str | None:
    name = (name or "").strip()
    return None if name.lower() in NO_DRAFT else name


def _get(app: AppState, name: str, loaded: list) -> object:
    """A model by name: reuse one already loaded under that name, else load it (slow: seconds to minutes)."""
    for model in loaded:
        if model is not None and model.name == name:
            return model
    return app.loader(name)


def load_models(app: AppState, target_name: str | None, draft_name: str | None) -> str:
    """Load target and draft as named and switch the app to them. Returns a status line; raises UserError
    with the reason when a model does not load or the draft's vocabulary differs (nothing changes then)."""
    from engine import ModelLoadError, VocabMismatchError

    target_name = clean_name(target_name) or "embedded"
    draft_name = clean_name(draft_name)
    if not app.options.allow_model_load:
        raise UserError("Loading models from the page is off on a shared demo: the host starts the app with "
                        "--allow-model-load to allow it.", "error")
    if not app.load_lock.acquire(blocking=False):
        raise UserError("Another model load is in progress; wait for it to finish.")
    try:
        old = app.runtime
        loaded = [old.target, old.draft] if old is not None else []
        if old is not None and old.target.name == target_name and \
                (old.draft.name if old.draft is not None else None) == draft_name:
            return f"Already loaded: {old.describe()}"
        try:
            target = _get(app, target_name, loaded)
            draft = _get(app, draft_name, loaded + [target]) if draft_name else None
            if old is None:
                runtime = make_runtime(target, draft, app.options, app.counters.observe)
            else:
                runtime = old.scheduler.call(
                    lambda _engine: make_runtime(target, draft, app.options, app.counters.observe))
        except VocabMismatchError as e:
            raise UserError(f"The draft model cannot draft for this target: {e}", "error") from e
        except ModelLoadError as e:
            raise UserError(f"Load failed: {e}", "error") from e
        except (RuntimeError, ValueError, OSError) as e:
            raise UserError(f"Load failed: {type(e).__name__}: {e}", "error") from e
        app.runtime = runtime
        if old is not None:
            old.scheduler.close()
        return f"Loaded: {runtime.describe()}"
    finally:
        app.load_lock.release()
