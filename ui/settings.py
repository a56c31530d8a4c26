"""The controls' values as one dataclass, turned into the engine's GenParams."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine import NGRAM_CHAIN, PRIORITY, GenParams, GrammarSpec, SamplerParams, SpecParams

DEFAULT_CHAIN = list(NGRAM_CHAIN)
DRAFT_MODEL_TYPE = "draft-simple"  # a draft model with the target's vocabulary
DRAFT_UNI_TYPE = "draft-uni"  # one with another vocabulary: it drafts through text
DRAFT_MODEL_TYPES = (DRAFT_MODEL_TYPE, DRAFT_UNI_TYPE)


def with_draft_type(types: list[str], kind: str) -> list[str]:
    """The chain once a draft model is loaded: it drafts through `kind` (the engine's draft_type), and the other
    draft-model type leaves the chain, since the engine would refuse it at the first answer."""
    kept = [t for t in types if t not in DRAFT_MODEL_TYPES or t == kind]
    return kept if kind in kept else kept + [kind]
HEAD_TYPE = "draft-head"
ALL_TYPES = list(PRIORITY)
GRAMMAR_TYPE = "grammar"

# the "Output format" control: (label, value); the value is a GrammarSpec kind, "free" for no grammar
FORMATS = [("free text", "free"), ("JSON (any object)", "json"), ("JSON schema", "json_schema"), ("regex", "regex"),
           ("grammar (Lark)", "lark"), ("grammar (GBNF, llama.cpp)", "gbnf")]
# what the format box holds when a format is picked: a working start the user edits
EXAMPLE_SCHEMA = """{
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 30},
    "age": {"type": "integer"},
    "city": {"type": "string", "maxLength": 30}
  },
  "required": ["name", "age", "city"],
  "additionalProperties": false
}"""
FORMAT_EXAMPLES = {"json_schema": EXAMPLE_SCHEMA, "regex": r"(yes|no), because [a-z ,]{10,80}\.",
                   "lark": 'start: "The answer is " ANSWER "."\nANSWER: /[0-9]+/',
                   "gbnf": 'root ::= ("yes" | "no") ", because " [a-z ,]+ "."'}


def format_box(kind: str, text: str):
    """The format box after the user picks a format: shown only for formats that take a text, and filled with
    that format's example unless it holds the user's own text."""
    import gradio as gr  # only the page needs it; the settings themselves are plain data

    own = (text or "").strip() and text not in FORMAT_EXAMPLES.values()
    value = text if own else FORMAT_EXAMPLES.get(kind, "")
    return gr.update(value=value, visible=kind in FORMAT_EXAMPLES)


def own_p_min_text() -> str:
    """The drafters' own p_min values, for the control's label."""
    from engine import DraftHeadParams, DraftModelParams

    return f"draft model {DraftModelParams().p_min:g}, draft head {DraftHeadParams().p_min:g}"


def _head_fits(target) -> bool:
    from engine import head_fits  # torch and the head's model: only when a page is built

    return head_fits(target)


def default_types(target) -> list[str]:
    """The chain a page starts with for this target (engine.starting_chain: the n-grams, then the head where it
    fits)."""
    from engine import starting_chain  # torch and the head's config: only when a page is built

    return starting_chain(target)


def full_chain(runtime, eagle3: str | None = None) -> list[str]:
    """Every drafter the loaded models allow, in relay order: default_types, then the loaded draft model's
    drafter (draft-simple, or draft-uni for another vocabulary), and the EAGLE-3 head that --draft named
    (draft-eagle3), or the block drafter whose checkpoint it named (draft-dflash, draft-dspark). The
    "playground" preset and the arena's chain."""
    types = default_types(runtime.target if runtime is not None else None)
    if runtime is not None and runtime.draft is not None:
        types = with_draft_type(types, getattr(runtime.engine, "draft_type", None) or DRAFT_MODEL_TYPE)
    params_of = getattr(getattr(runtime, "engine", None), "drafter_params_of", lambda name: None)
    given = [t for t in ("draft-dflash", "draft-dspark") if params_of(t) is not None]
    return types + (["draft-eagle3"] if eagle3 else []) + given


def default_chain(runtime, eagle3: str | None = None) -> list[str]:
    """The chain a page (or an API request) starts with: the full chain without the model drafters the load's
    probe found unable to pay on this machine (ui/presets.py, probe_model_drafters), so that the default is
    never slower than its own n-gram part."""
    left_out = getattr(runtime, "left_out", None) or {}
    return [t for t in full_chain(runtime, eagle3) if t not in left_out]


def default_tree_nodes(runtime) -> int:
    """The tree nodes a page (or an API request) starts with: 0 (chains) where the load's probe timed trees no
    faster than chains here (ui/presets.py, probe_trees), else Settings.tree_nodes."""
    trees = getattr(runtime, "trees", None)
    return Settings.tree_nodes if trees is None else int(trees.nodes)


def chain_for_target(types: list[str], target) -> tuple[list[str], str]:
    """The chain after a new target is loaded: draft-head joins it where the head fits the target and leaves
    it where it does not (it would refuse to draft). Returns (types, a note for the user, or "")."""
    types, fits = list(types), _head_fits(target)
    if fits and HEAD_TYPE not in types:
        return types + [HEAD_TYPE], f"{HEAD_TYPE} joined the chain: its head was trained for this model."
    if not fits and HEAD_TYPE in types:
        types.remove(HEAD_TYPE)
        return types, f"{HEAD_TYPE} left the chain: its head was trained for the embedded model only."
    return types, ""


@dataclass
class Settings:
    """Everything the sidebar sets; app.py names each control by its field."""

    types: list[str] = field(default_factory=lambda: list(DEFAULT_CHAIN))  # drafter chain, in relay order
    n_max: int = 16
    n_min: int = 0
    p_min: float = 0.75
    adaptive: bool = True
    temp: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    max_new_tokens: int = 128
    compare: bool = True  # run plain decoding after the speculative run, for speedup and the lossless check
    # "auto": seq_rm for a chain's tail, cell by cell for a tree's branches, a checkpoint only where the memory needs
    # one; "checkpoint": checkpoint, restore and replay on every rejection
    rollback: str = "auto"
    p_min_own: bool = True  # each model drafter uses its own p_min (own_p_min_text), not the p_min above
    output_format: str = "free"  # "free" (no grammar) or a GrammarSpec kind: json | json_schema | regex | lark | gbnf
    format_text: str = ""  # the JSON schema, regex or Lark grammar of that format (unused for free and json)
    # trees of drafts: every drafter proposes and one forward checks them all, at most this many nodes per round;
    # 0: one chain from the first drafter that has one (engine/draft/tree.py)
    tree_nodes: int = 16

    def grammar(self) -> GrammarSpec | None:
        """The output format as the engine's GrammarSpec; None for free text."""
        kind = str(self.output_format or "free")
        return None if kind == "free" else GrammarSpec(kind, str(self.format_text or ""))

    def chain(self, speculative: bool) -> list[str]:
        """The drafter chain sent to the engine: with an output format, `grammar` leads it (its forced tokens
        cost no model call and are kept whenever the target agrees); plain decoding stays plain."""
        types = list(self.types or []) if speculative else []
        if types and self.grammar() is not None and GRAMMAR_TYPE not in types:
            types.insert(0, GRAMMAR_TYPE)
        return types

    def gen_params(self, speculative: bool = True, explain: bool = False) -> GenParams:
        """GenParams for the engine; speculative=False is the plain baseline with the same sampler and seed;
        explain: the events carry each token's target entropy, for the hover of an answer the page shows.
        Raises ValueError with a message for the user (validated here so nothing is submitted on bad input)."""
        params = GenParams(
            max_new_tokens=int(self.max_new_tokens),
            sampling=SamplerParams(temp=float(self.temp), top_k=int(self.top_k), top_p=float(self.top_p),
                                   min_p=float(self.min_p), seed=int(self.seed)),
            spec=SpecParams(types=self.chain(speculative), n_max=int(self.n_max),
                            n_min=int(self.n_min), p_min=None if self.p_min_own else float(self.p_min),
                            adaptive=bool(self.adaptive), tree_nodes=int(self.tree_nodes),
                            rollback=str(self.rollback or "auto")),
            # the plain baseline is constrained too, so the lossless check compares like with like
            grammar=self.grammar(), explain=explain,
        )
        params.validate()
        return params


def settings_from(values: dict) -> Settings:
    """Build Settings from the control values by field name (numbers arrive as floats or None)."""
    unknown = set(values) - set(Settings.__dataclass_fields__)
    if unknown:
        raise ValueError(f"no setting is named {', '.join(sorted(unknown))}")
    s = Settings()
    for name, value in values.items():
        if value is None:
            continue  # a cleared number box: keep the default rather than fail on None
        setattr(s, name, value)
    s.types = [t for t in (s.types or []) if t]
    for name in ("n_max", "n_min", "top_k", "seed", "max_new_tokens", "tree_nodes"):
        setattr(s, name, int(getattr(s, name)))
    return s
