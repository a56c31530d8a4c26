"""State objects: the app's shared models and scheduler, and each browser session's own conversation.

The app state is created by app.py and handed to ui.app.build(); nothing lives in module globals. A session's
state is a gr.State value: one per browser tab, so two people never see each other's text, while every session
shares the engine through the Scheduler, which batches them.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from typing import Callable

from engine import EngineView, SpecCounters
from ui.run import RunRecord
from ui.run_folders import RunFolders
from ui.tokens import Vocab
from ui.visitors import ClientLimits, visitor_id


SESSION_TTL_S = 3600.0  # an opened page not generating is forgotten after this long (AppState.opened)
SESSIONS_MIN = 100  # sessions kept in memory at least (a class); more with more slots and places in line


def session_capacity(options: "AppOptions") -> int:
    """Visitors' sessions kept in memory: past it the longest idle is forgotten, so clients that come and
    never say goodbye (an API script's sessions, closed laptops) cannot grow the app's memory without bound."""
    return max(SESSIONS_MIN, 4 * (options.parallel + options.queue_max))


@dataclass
class AppOptions:
    n_ctx: int = 4096
    parallel: int = 4  # slots: sessions that can generate at the same time
    trust_remote_code: bool = False
    n_rs: int = 0  # recurrent models: tail length undone from kept states instead of a checkpoint (0 = off)
    queue_max: int = 64  # requests that may wait for a slot; past it a new one is told to come back later
    allow_model_load: bool = True  # whether a visitor may load other models from the page (off on a shared demo)
    dtype: str = "auto"  # weights' dtype for every model loaded: auto / float32 / bfloat16 / int8 (engine/load/dtype.py)
    device: str = "cpu"  # where every model loaded runs: cpu / cuda / cuda:N / auto (engine/forward/device.py, --device)
    # the round's draft budget: "fair" keeps every answer at plain decoding's speed or better, "goodput" lets a
    # copying answer take rows that slow the answers beside it when the batch emits more (engine/budget/tree_budget.py)
    budget: str = "fair"
    threads: int | None = None  # forwards' threads; None: all cores, fewer while others hold some (engine/serve/threads.py)
    eagle3: str | None = None  # --draft DIR holding an EAGLE-3 head: offered as the drafter draft-eagle3
    dflash: str | None = None  # --draft PATH, a DFlash or DSpark checkpoint: offered as draft-dflash or draft-dspark
    ctx_per_slot: int | None = None  # cells one answer may hold (llama-server's n_ctx / n_parallel); None: all
    # cached prompt prefixes pass between clients (a class's shared system prompt prefilled once); off, each
    # page tab and API client reuses only its own, so nobody can probe another's prompt through cache_n
    share_prefix_cache: bool = False
    model_choices: tuple[str, ...] = ()  # the page's list of models to load (ui/catalog.py); () the packaged ones
    # the page may name a remote server for its chat: only where only this machine reaches the app
    # (ui/sharing.py local_only); elsewhere the operator names it with --remote, so no visitor can point the
    # app at a host of their choosing
    remote_from_page: bool = False


@dataclass
class Runtime:
    """Models and the engine serving them. Replaced as a whole when the user loads other models."""

    target: object  # engine.load.models.LoadedModel
    draft: object | None  # LoadedModel or None
    engine: EngineView  # the engine.Engine, as far as the page reads it
    scheduler: object  # engine.Scheduler
    vocab: Vocab
    roofline: object = None  # engine.cost.roofline.Roofline: the forward's cost by rows beside the weights' floor
    left_out: dict = field(default_factory=dict)  # model drafters the load's probe found unable to pay here: why
    trees: object = None  # ui.presets.TreeChoice: chains or trees, as the load's probe timed them here
    text_chars: int = 0  # the most characters a text may hold before it is tokenized (ui/limits.py; 0: not yet)

    def lossless_checked(self) -> bool:
        """Whether the target passed the load check (engine/memory/self_check.py): only then may the page call
        a run identical to plain decoding lossless."""
        check = getattr(self.engine, "load_check", None)
        return check is not None and check.lossless_shown

    def _check(self) -> str:
        check = getattr(self.engine, "load_check", None)
        if check is None:
            return "load check: not run"
        verdict = {True: "passed", False: "failed", None: "incomplete"}[check.passed]
        return f"load check {verdict}: {check.detail}"

    def describe(self) -> str:
        probe = self.engine.probe
        draft = self.draft.name if self.draft is not None else "none"
        if getattr(self.engine, "draft_mismatch", None):
            draft += " (another vocabulary: draft-uni)"
        ctx = self.engine.ctx
        forward = ctx.describe_forward()
        model = getattr(self.target, "model", None)
        if model is not None:
            from engine import linear_paths

            forward += f", linears: {linear_paths(model)}"
        return (f"target {self.target.name} ({self.target.n_params / 1e6:.0f}M params, {self.target.device}, "
                f"{self.target.dtype}: {self.target.dtype_reason}; {forward}) · "
                f"draft {draft} · rollback {probe.kind}: {probe.reason} · {self._check()} · "
                f"{ctx.n_seq_max} slots, {ctx.n_ctx} cells"
                + (f" · {self.engine.threads.describe()}" if hasattr(self.engine, "threads") else ""))


@dataclass
class AppState:
    runtime: Runtime | None
    options: AppOptions = field(default_factory=AppOptions)
    loader: Callable | None = None  # (name, trust_remote_code) -> LoadedModel; app.py passes engine.load_model
    load_lock: threading.Lock = field(default_factory=threading.Lock)  # one model load at a time
    turn_lock: threading.Lock = field(default_factory=threading.Lock)  # a session's busy check and its claim
    # session hash -> (SessionState, time.monotonic() it opened), to free slots of closed tabs (AppState.opened)
    sessions: dict = field(default_factory=dict)
    # every generation's rounds counted, page and API alike; kept across model loads so /metrics only grows
    counters: SpecCounters = field(default_factory=SpecCounters)
    run_folders: RunFolders = field(default_factory=RunFolders)  # the Benchmark and Arena tabs' downloads
    # requests in flight per visitor, page turns and API requests together (ui/visitors.py)
    limits: ClientLimits = field(default_factory=lambda: ClientLimits(max_each=2))
    # gr.Request -> the visitor it comes from (app.py sets it from the guard's keys and sign-ins); None: its address
    identify: Callable | None = None
    remote: object = None  # ui/remote_page.py RemotePage the chat talks to (--remote, or the page's field); None

    def visitor(self, request) -> str:
        """The visitor a page request comes from, named as the API names its clients (ui/visitors.py)."""
        if self.identify is not None and request is not None:
            return self.identify(request)
        client = getattr(request, "client", None)
        return visitor_id(None, getattr(client, "host", None))

    def opened(self, session_hash: str, session: "SessionState", now: float) -> None:
        """Remember an opened page, and forget those idle past SESSION_TTL_S: an API client that vanished sends
        no unload event, and an idle session holds nothing the unload would free (a step-mode answer left
        alone ends by itself: engine.serve.scheduler.STEP_ABANDON_S)."""
        for key, (other, since) in list(self.sessions.items()):
            if not other.busy and now - since > SESSION_TTL_S:
                del self.sessions[key]
        self.sessions[session_hash] = (session, now)
        idle = [key for key, (other, _) in self.sessions.items() if not other.busy]  # oldest first
        for key in idle[: max(0, len(self.sessions) - session_capacity(self.options))]:
            del self.sessions[key]

    def closed(self, session_hash: str | None) -> "SessionState | None":
        entry = self.sessions.pop(session_hash, None)
        return None if entry is None else entry[0]


@dataclass
class Active:
    """A generation in flight: the scheduler it runs on and its handle there (id, events, counters)."""

    scheduler: object  # engine.Scheduler
    gen: object  # engine.serve.requests.Generation
    run: RunRecord
    manual: bool = False  # step mode: advanced only by scheduler.step
    finished: bool = False  # its last event was read (or the page left): nothing more to read


@dataclass
class SessionState:
    """One browser tab: its conversation, the generation being shown, and the comparison run."""

    history: list[dict] = field(default_factory=list)  # chat messages of finished turns (role, content)
    turns_html: list[str] = field(default_factory=list)  # cached HTML of finished turns
    pending_user: str = ""  # the message of the turn in progress
    run: RunRecord | None = None  # the speculative run shown (live or last)
    plain: RunRecord | None = None  # the plain run of the comparison
    compare_html: str = ""  # speedup + lossless badge of the last comparison
    compare_base: str = ""  # the comparison's lines without the advice (the advice's own run adds its result)
    advice: object = None  # ui.advisor.Advice for the last compared answer, None: none
    explained: object = None  # ui.lesson.Explained of the last compared answer (a, k, c, speedups), None: none
    format_html: str = ""  # whether the last answer parses and follows its output format ("" for free text)
    format_spec: object = None  # the turn's output format (engine.grammar.GrammarSpec), None for free text
    active: Active | None = None  # generation in flight, if any
    notice: tuple[str, str] = ("", "info")  # (text, level) of the message box
    seq_stats: dict = field(default_factory=dict)  # engine counters of the last run's sequence (snapshot)
    plot_due: float = 0.0  # perf_counter time after which the charts may be redrawn
    charts_key: tuple = ()  # which run (and whether finished) the charts on the page show
    show_rejected: bool = True  # the chat shows rejected drafts; read by every redraw, a streaming one too
    # a streaming turn from its start to the end of its comparison (between the two runs no generation is
    # active, and a second turn must not start there); set under AppState.turn_lock
    turn_open: bool = False
    dropped_turns: int = 0  # oldest turns the last prompt left out to fit the context (said on the page)
    forgotten_turns: int = 0  # turns removed from history since the chat began, all prompts together (on the page)
    # the HTML each view was last sent (the components start empty): a streaming update re-sends it for the
    # views it leaves as they are, since a gr.skip() makes Gradio build a component and its config per output
    shown: dict[str, str] = field(default_factory=dict)
    # GenParams.cache_salt of its turns, drawn at the session's first turn: gr.State deep-copies one initial
    # value into every tab, so a salt drawn at build time would be every tab's
    cache_salt: str = ""
    visitor: str = ""  # who opened it (ui/visitors.py): its turns count against that visitor's share
    held_by: str = ""  # the visitor whose share this session's turn counts against until it ends ("" none)

    def salt(self) -> str:
        if not self.cache_salt:
            self.cache_salt = secrets.token_hex(16)
        return self.cache_salt

    @property
    def busy(self) -> bool:
        return self.turn_open or (self.active is not None and not self.active.finished)
