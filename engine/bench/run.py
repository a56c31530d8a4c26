"""One benchmark run: a group of prompts through our engine (plain or speculative) or through HF generate.

BenchConfig says what runs, RunResult holds one prompt's tokens and round events and derives every number a
traces.csv row reports from them; group_tps is what the group's slots decoded together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.bench.inputs import grammar_from_args, parse_head_tree, prompt_grammar
from engine.bench.lossless import lossless_check, verify_modes
from engine.events import RoundEvent
from engine.grammar import GrammarSpec
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams

FILLER = ("The archive holds letters, ledgers and maps from the harbour town, sorted by year and by the family "
          "that kept them. Each box has a label, a short summary and a list of the people named inside. ")


@dataclass
class BenchConfig:
    target: str  # model to load
    draft: str | None  # draft model, for draft-simple
    spec: SpecParams  # speculation settings of the spec runs
    sampling: SamplerParams  # sampler of every run (same seed for plain and spec)
    max_new_tokens: int  # per prompt
    parallel: int  # prompts run at once (slots)
    ctx_len: int  # filler tokens put before each prompt
    n_ctx: int  # KV cells
    trust_remote_code: bool
    quant_bits: int = 0  # filled once the target is loaded
    dtype: str = "auto"  # weights' dtype asked for, target and draft (engine/load/dtype.py)
    dtype_used: str = ""  # filled once the target is loaded: the dtype it runs in, and why
    dtype_reason: str = ""
    device: str = "cpu"  # --device: where target and draft run (engine/forward/device.py)
    ignore_eos: bool = False  # generate max_new_tokens whatever the text (fixed-length sweeps)
    n_rs: int = 0  # recurrent targets: tail undone from kept states instead of a checkpoint (engine.memory.rs_steps)
    # the output format of every prompt (--json-schema, --regex, --grammar); a prompt's own field overrides it
    grammar: GrammarSpec | None = None
    head_tree: tuple[int, int, float] | None = None  # --head-tree: the draft head's tree shape (engine/draft/head/tree.py)
    # --budget fair / goodput: several slots' draft rows (engine/budget/tree_budget.py, SlotLedger.fair)
    fair: bool = True
    threads: int | None = None  # --threads: forwards on this many threads; None: fewer while cores are taken

    @classmethod
    def from_args(cls, a, n_max: int, parallel: int, ctx_len: int) -> "BenchConfig":
        """The first configuration of a sweep (engine.bench.sweep varies n_max, parallel, ctx_len from it)."""
        from engine.draft.registry import parse_types
        from engine.load.dflash import dflash_kind
        from engine.load.eagle3 import is_eagle3_dir

        spec = SpecParams(types=parse_types(a.spec), n_max=n_max, n_min=a.n_min, p_min=a.p_min,
                          adaptive=not a.no_adaptive, rollback=a.rollback,
                          tree_nodes=a.tree_nodes if a.tree == "on" else 0)
        # a checkpoint given as --draft drafts as its own drafter: an EAGLE-3 head, a DFlash or DSpark block
        own = ("draft-eagle3" if is_eagle3_dir(a.draft) else dflash_kind(a.draft)) if a.draft else None
        if own:
            spec.types = list(dict.fromkeys(own if t == "draft-simple" else t for t in spec.types))
        sampling = SamplerParams(temp=a.temp, seed=a.seed)
        cfg = cls(target=a.target, draft=a.draft, spec=spec, sampling=sampling, max_new_tokens=a.max_new_tokens,
                  parallel=parallel, ctx_len=ctx_len, n_ctx=a.n_ctx, trust_remote_code=a.trust_remote_code,
                  ignore_eos=a.ignore_eos, n_rs=a.n_rs, grammar=grammar_from_args(a), dtype=a.dtype,
                  head_tree=parse_head_tree(getattr(a, "head_tree", None)),
                  fair=getattr(a, "budget", "fair") == "fair", threads=getattr(a, "threads", None),
                  device=getattr(a, "device", "cpu"))
        if a.repeat < 1 or a.max_new_tokens < 1 or a.n_rs < 0:
            raise ValueError("--repeat and --max-new-tokens must be >= 1, --n-rs >= 0")
        # the run's grammar compiles here, before any model loads; the prompts' own ones once the target is known
        GenParams(max_new_tokens=a.max_new_tokens, sampling=sampling, spec=spec, ignore_eos=a.ignore_eos,
                  grammar=cfg.grammar).validate()
        return cfg

    @property
    def draft_is_eagle3(self) -> bool:
        """--draft names a directory holding an EAGLE-3 head (engine/load/eagle3.py), drafted by draft-eagle3."""
        from engine.load.eagle3 import is_eagle3_dir

        return bool(self.draft) and is_eagle3_dir(self.draft)

    @property
    def draft_block_kind(self) -> str | None:
        """draft-dflash or draft-dspark where --draft names such a checkpoint (engine/load/dflash.py), else None."""
        from engine.load.dflash import dflash_kind

        return dflash_kind(self.draft) if self.draft else None

    def grammar_of(self, prompt: dict) -> GrammarSpec | None:
        """The output format of one prompt: its own "json_schema" or "regex" field, else the run's."""
        return prompt_grammar(prompt) or self.grammar

    def load(self):
        """Target and draft models (slow); raises ModelLoadError (a ValueError/OSError) with the reason."""
        from engine.load.models import load_model

        target = load_model(self.target, device=self.device, trust_remote_code=self.trust_remote_code,
                            dtype=self.dtype)
        # an EAGLE-3 head is no model of its own: draft-eagle3 reads it when the engine is built
        draft = (load_model(self.draft, device=self.device, trust_remote_code=self.trust_remote_code,
                            dtype=self.dtype)
                 if self.draft and not self.draft_is_eagle3 and not self.draft_block_kind else None)
        self.quant_bits = target.quant_bits
        self.dtype_used, self.dtype_reason = target.dtype, target.dtype_reason
        return target, draft

    def build(self, target=None, draft=None, n_seq_max: int | None = None, n_draft: int | None = None):
        """The engine all configurations of a run share: slots for the widest concurrency, logits rows for the
        longest draft."""
        from engine.serve.engine import Engine

        if target is None:
            target, draft = self.load()
        from engine.draft.head.eagle3 import Eagle3Params
        from engine.draft.head.drafter import DraftHeadParams
        from engine.draft.head.tree import HeadTreeParams

        tree = HeadTreeParams(*self.head_tree) if self.head_tree is not None else HeadTreeParams()
        drafter_params = {"draft-head": DraftHeadParams(tree=tree)}
        if self.draft_is_eagle3:
            drafter_params["draft-eagle3"] = Eagle3Params(weights=Path(self.draft), tree=tree)
        if self.draft_block_kind:
            from engine.draft.dflash import DFlashParams

            drafter_params[self.draft_block_kind] = DFlashParams(weights=Path(self.draft))
        engine = Engine(target, draft=draft, n_ctx=self.n_ctx, n_seq_max=n_seq_max or max(self.parallel, 1),
                        n_draft=self.spec.n_max if n_draft is None else n_draft, n_rs=self.n_rs,
                        drafter_params=drafter_params, fair=self.fair, threads=self.threads)
        if self.spec.types and not engine.probe.can_speculate:
            raise RuntimeError(f"speculation is off for this model: {engine.probe.reason}")
        return engine


@dataclass
class RunResult:
    tokens: list[int]
    seconds: float  # wall time of the group this prompt ran in
    spec_on: bool
    # identical to the plain run; "" when not checkable, "n/a" when tokens cannot match (engine.bench.lossless)
    lossless_ok: bool | str = True
    events: list[RoundEvent] = field(default_factory=list)
    rollback_mode: str = "seq_rm"
    t_plain_step_ms: float = 0.0  # mean time of one plain decoding step (from the plain run)
    match_plain: int | str = ""  # another implementation's run: its leading tokens equal to our plain run's

    @property
    def tps(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0

    def _spec(self) -> list[RoundEvent]:
        return [e for e in self.events if e.kind == "spec"]

    @property
    def verify_modes(self) -> list[str]:
        return verify_modes(self.events)

    @property
    def n_rounds(self) -> int:
        return len([e for e in self.events if e.kind != "prefill"])

    @property
    def n_drafted(self) -> int:
        """Draft tokens verified: every node of a tree."""
        return sum(len(e.tree_tokens) or len(e.drafted) for e in self._spec())

    @property
    def tree_nodes(self) -> float:
        """Mean draft nodes verified per drafted round (a chain's length where the round had no tree)."""
        n = len(self._spec())
        return self.n_drafted / n if n else 0.0

    @property
    def rows_per_forward(self) -> float:
        """Mean rows of the target forwards this run's rounds ran in (shared with other slots' rows)."""
        rounds = [e.batch_rows for e in self.events if e.kind != "prefill"]
        return sum(rounds) / len(rounds) if rounds else 0.0

    @property
    def n_accepted(self) -> int:
        return sum(e.n_accepted for e in self._spec())

    @property
    def mean_acc_len(self) -> float:
        """llama.cpp's #mean acc len: 1 + accepted tokens per verified draft."""
        n = len(self._spec())
        return 1.0 + self.n_accepted / n if n else (1.0 if self.events else 0.0)

    @property
    def forced_tokens(self) -> int:
        """Tokens accepted from the grammar drafter: the part of the output its format forced."""
        return sum(e.n_accepted for e in self._spec() if e.drafter == "grammar")

    @property
    def accept_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def accept_p(self) -> float:
        """alpha of the speedup formula (engine.bench.stats.formula): the chance that a draft token is kept given
        the ones before it were, i.e. accepted / (accepted + first rejections). accept_rate (accepted / drafted)
        is lower whenever tokens after a rejection go unjudged; with synthetic acceptance P this estimates P."""
        spec = self._spec()
        tries = sum(e.n_accepted + (e.n_accepted < len(e.drafted)) for e in spec)
        return self.n_accepted / tries if tries else 0.0

    @property
    def decode_span(self) -> tuple[float, float]:
        """(end of the prefill round, end of the last round): perf_counter stamps of the engine."""
        pre = [e.t_end for e in self.events if e.kind == "prefill"]
        if not pre or not self.events:
            return 0.0, 0.0
        return pre[0], self.events[-1].t_end

    @property
    def n_decoded(self) -> int:
        """Tokens after the one the prefill round gives."""
        return max(0, len(self.tokens) - 1)

    @property
    def tokens_per_forward(self) -> float:
        """Tokens per target forward after the prefill: n_decoded over the decode rounds (plain decoding: 1)."""
        return self.n_decoded / self.n_rounds if self.n_rounds else 0.0

    @property
    def tps_decode(self) -> float:
        """Tokens/s after the prefill: what speculation changes (the prefill is the same in both runs and, at
        a long context, would hide the decode speed)."""
        t0, t1 = self.decode_span
        return self.n_decoded / (t1 - t0) if t1 > t0 else 0.0

    @property
    def acc_rate_pos(self) -> list[float]:
        reach, kept = reach_and_kept(self.events)
        return [k / r for k, r in zip(kept, reach)]

    def _mean(self, attr: str, kinds: tuple[str, ...]) -> float:
        xs = [getattr(e, attr) for e in self.events if e.kind in kinds]
        return sum(xs) / len(xs) if xs else 0.0

    @property
    def t_draft_ms(self) -> float:
        return self._mean("t_draft_ms", ("spec", "plain"))

    @property
    def t_verify_ms(self) -> float:
        return self._mean("t_verify_ms", ("spec", "plain"))

    @property
    def t_rollback_ms(self) -> float:
        return self._mean("t_rollback_ms", ("spec",))

    @property
    def t_round_ms(self) -> float:
        """Mean wall time of a round that verified a draft: draft + verify + rollback."""
        xs = [e.t_draft_ms + e.t_verify_ms + e.t_rollback_ms for e in self._spec()]
        return sum(xs) / len(xs) if xs else 0.0

    @property
    def verify_cost_c(self) -> float:
        """c of the speedup formula (engine.bench.stats.formula): a speculative round costs (c + 1) plain steps."""
        if not self._spec() or self.t_plain_step_ms <= 0:
            return 0.0
        return self.t_round_ms / self.t_plain_step_ms - 1.0


def reach_and_kept(events: list[RoundEvent]) -> tuple[list[int], list[int]]:
    """Per draft position, over the verified drafts among `events`: how many reached it, how many were kept there
    (llama.cpp's #acc rate/pos)."""
    reach: list[int] = []
    kept: list[int] = []
    for e in events:
        if e.kind != "spec":
            continue
        for i in range(len(e.drafted)):
            if i == len(reach):
                reach.append(0)
                kept.append(0)
            reach[i] += 1
            kept[i] += i < e.n_accepted
    return reach, kept


def group_tps(results: list[RunResult]) -> float:
    """Aggregate decode tokens/s of every slot of a group (the fillers too): what N slots serve together."""
    spans = [r.decode_span for r in results if r.decode_span[1] > 0]
    if not spans:
        return 0.0
    seconds = max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans)
    return sum(r.n_decoded for r in results) / seconds if seconds > 0 else 0.0


def prompt_ids(engine, p: dict, ctx_len: int) -> list[int]:
    return prompt_ids_of(engine.target, p, ctx_len)


def prompt_ids_of(tm, p: dict, ctx_len: int) -> list[int]:
    """The prompt's tokens behind `ctx_len` tokens of filler text (a system message for chat prompts)."""
    filler = ""
    if ctx_len > 0:
        per = max(1, len(tm.encode(FILLER)))
        filler = FILLER * (ctx_len // per + 1)
        filler = tm.decode(tm.encode(filler)[:ctx_len])
    if "messages" in p:
        msgs = list(p["messages"])
        if filler:
            msgs = [{"role": "system", "content": filler}] + msgs
        return tm.encode_chat(msgs)
    return tm.encode(filler + p["prompt"])


def run_ours(cfg: BenchConfig, engine, group: list[dict], spec: bool, reference: list[RunResult] | None = None,
             warmup: bool = False) -> list[RunResult]:
    spec_params = cfg.spec if spec else SpecParams(types=[])
    n_new = min(16, cfg.max_new_tokens) if warmup else cfg.max_new_tokens
    seqs = []
    ids = [prompt_ids(engine, p, cfg.ctx_len) for p in group]
    t0 = time.perf_counter()
    for i, toks in enumerate(ids):
        # plain and speculative runs alike are constrained: lossless_ok compares constrained with constrained
        params = GenParams(max_new_tokens=n_new, sampling=SamplerParams(**vars(cfg.sampling)),
                           spec=SpecParams(**{**vars(spec_params), "types": list(spec_params.types)}),
                           ignore_eos=cfg.ignore_eos, grammar=cfg.grammar_of(group[i]))
        seqs.append(engine.start(toks, params, seq=i).seq)
    events: dict[int, list[RoundEvent]] = {s: [] for s in seqs}
    while engine.active():
        for ev in engine.step():
            events[ev.seq].append(ev)
    seconds = time.perf_counter() - t0
    out = []
    for i, seq in enumerate(seqs):
        evs = events[seq]
        toks = [t for e in evs for t in e.emitted]
        res = RunResult(tokens=toks, seconds=seconds, spec_on=spec, events=evs,
                        # the setting and what the probe found, e.g. auto/PART (seq_rm), auto/FULL (checkpoints)
                        rollback_mode=f"{cfg.spec.rollback}/{engine.probe.kind}" if spec else "none")
        if reference is not None:
            # synthetic acceptance and rejection sampling cannot reproduce the plain tokens: "n/a", not checked
            synthetic = spec and cfg.spec.synthetic_accept is not None
            res.lossless_ok = lossless_check(toks, reference[i].tokens, evs, synthetic)
            res.t_plain_step_ms = reference[i].t_verify_ms + reference[i].t_draft_ms
        else:
            res.t_plain_step_ms = res.t_verify_ms
        out.append(res)
    for seq in seqs:
        engine.release(seq)
    return out
