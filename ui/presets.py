"""Presets of the speculation controls: this playground's default, llama.cpp's own behaviour, the setting
measured fastest on this machine at load, and plain decoding.

- "playground": the starting chain (the n-grams, then the model drafters) in trees under the round's budget,
  with adaptive lengths: the app's default.
- "llama.cpp": linear chains in llama.cpp's relay order (n-grams first, then model drafters), its defaults from
  common/common.h (n_max 16, n_min 0, p_min 0.75), no adaptive length, no trees; its warnings said.
- "fastest here": the playground's chain without the model drafters that the probe at load found unable to pay
  on this machine (`probe_model_drafters`), so it is never slower than its own n-gram part.
- "plain": no drafter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRESETS = ("playground", "llama.cpp", "fastest here", "plain")
LLAMA_CPP = dict(n_max=16, n_min=0, p_min=0.75)  # common_params_speculative's defaults
NGRAM_MOD_WARN = 16  # llama.cpp warns when ngram-mod's match length is below this
PROBE_PROMPT = "Write a short note to a neighbour about a parcel you took in for them."
PROBE_TOKENS = 32  # tokens the probe generates with each model drafter alone
# the tree probe's prompts: one open (the model drafters' ground), one that copies (the n-grams')
TREE_PROBE_PROMPTS = (PROBE_PROMPT, "Repeat this list twice, one item a line: apples, bread, milk, eggs, tea.")
TREE_PROBE_TOKENS = 48  # tokens per prompt and configuration
TREE_MARGIN = 1.05  # trees are chosen only this much faster than chains: a tie goes to the simpler chain


@dataclass(frozen=True)
class TreeChoice:
    """Chains or trees for the presets that draft with every drafter, as the load's probe measured them here."""

    nodes: int  # tree nodes a round may verify: 0 = chains
    chain_tps: float = 0.0  # decode tokens/s of the chain on the probe (0: not measured)
    tree_tps: float = 0.0  # the same drafters in trees
    why: str = ""  # one line for the page


@dataclass(frozen=True)
class Preset:
    name: str
    types: list[str]
    n_max: int = 16
    n_min: int = 0
    p_min: float | None = None  # None: each model drafter's own
    adaptive: bool = True
    tree_nodes: int = 0
    notes: list[str] = field(default_factory=list)  # what the user should know about it here


def is_model_drafter(name: str) -> bool:
    return name.startswith("draft-")


def preset(name: str, chain: list[str], left_out: dict[str, str], ngram_mod_match: int | None = None,
           trees: TreeChoice | None = None) -> Preset:
    """The preset `name` for a page whose starting chain is `chain`; left_out: the model drafters the load's
    probe found unable to pay here, with why; trees: chains or trees as the load's probe found (None: trees of
    Settings.tree_nodes, unmeasured)."""
    from ui.settings import Settings

    d = Settings()
    trees = trees or TreeChoice(nodes=d.tree_nodes)
    tree_note = [trees.why] if trees.why else []
    if name == "playground":
        return Preset(name, list(chain), n_max=d.n_max, n_min=d.n_min, adaptive=True, tree_nodes=trees.nodes,
                      notes=tree_note)
    if name == "llama.cpp":
        order = [t for t in chain if not is_model_drafter(t)] + [t for t in chain if is_model_drafter(t)]
        notes = ["linear chains, n-grams first then model drafters, llama.cpp's n_max 16 / n_min 0 / p_min 0.75, "
                 "no adaptive length: a rejected tail is cut with seq_rm each round"]
        if ngram_mod_match is not None and ngram_mod_match < NGRAM_MOD_WARN and "ngram-mod" in order:
            notes.append(f"llama.cpp would warn: ngram-mod's match length {ngram_mod_match} is under "
                         f"{NGRAM_MOD_WARN} (its drafts are noisier); this app's n-gram keys are shorter than "
                         "llama.cpp's 12 (24 for ngram-mod) to realign fast on chat answers")
        return Preset(name, order, adaptive=False, tree_nodes=0, notes=notes, **LLAMA_CPP)
    if name == "fastest here":
        kept = [t for t in chain if t not in left_out]
        notes = [f"{t} left out: {why}" for t, why in left_out.items()] or [
            "every drafter of the chain can pay on this machine"]
        return Preset(name, kept, n_max=d.n_max, n_min=d.n_min, adaptive=True, tree_nodes=trees.nodes,
                      notes=notes + tree_note)
    if name == "plain":
        return Preset(name, [], adaptive=False, notes=["plain decoding: one token a forward"])
    raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {name!r}")


def probe_model_drafters(engine, prompt: list[int], chain: list[str], roof, p_min: float | None = None
                         ) -> dict[str, str]:
    """At load, before anyone is served: each model drafter of the chain drafts alone over a short greedy
    answer; it is left out of "fastest here" when the best chain length its measured acceptance and cost allow
    does not beat plain decoding (ui/advisor.py's arithmetic); p_min: None, each drafter's own. Returns {type:
    why} for those left out."""
    from engine import GenParams, SpecParams
    from ui.advisor import chain_tokens

    left_out = {}
    if roof is None or not roof.rows:
        return left_out
    step_ms = roof.seconds[0] * 1e3
    for name in [t for t in chain if is_model_drafter(t)]:
        params = GenParams(max_new_tokens=PROBE_TOKENS, spec=SpecParams(types=[name], n_max=8, adaptive=False,
                                                                               p_min=p_min))
        try:
            events = [ev for ev in engine.generate(list(prompt), params) if ev.kind != "prefill"]
        except (ValueError, RuntimeError) as e:
            left_out[name] = f"it could not draft here ({e})"
            continue
        drafted = [ev for ev in events if ev.drafted]
        calls_ms = sum(ev.t_draft_ms for ev in events) / max(1, len(events))
        reached = [sum(len(ev.drafted) > i for ev in drafted) for i in range(8)]
        acceptance = [sum(ev.n_accepted > i for ev in drafted) / n for i, n in enumerate(reached) if n]
        best = max((chain_tokens(acceptance, k) * step_ms / (roof.ratio(k + 1) * step_ms + calls_ms)
                    for k in range(1, 9)), default=0.0)
        if best < 1.0:
            first = acceptance[0] if acceptance else 0.0
            left_out[name] = (f"its call costs {calls_ms:.1f} ms against a {step_ms:.1f} ms step and it kept "
                              f"{first:.0%} at the first position on the probe: at best {best:.2f}x here")
    return left_out


def decode_time(engine, prompt: list[int], chain: list[str], nodes: int, n_new: int = TREE_PROBE_TOKENS,
                temp: float = 0.0, seed: int = 0) -> tuple[int, float]:
    """(tokens after the first, seconds after the prefill) of one answer drafted by `chain` (trees of `nodes`)."""
    from engine import GenParams, SamplerParams, SpecParams, decode_seconds

    params = GenParams(max_new_tokens=n_new, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                       spec=SpecParams(types=list(chain), n_max=16, adaptive=True, tree_nodes=nodes))
    events = list(engine.generate(list(prompt), params))
    return sum(len(e.emitted) for e in events if e.kind != "prefill"), decode_seconds(events)


def probe_trees(engine, target, chain: list[str], nodes: int | None = None) -> TreeChoice:
    """At load, before anyone is served: the chain and the same drafters in trees of `nodes` (default
    Settings.tree_nodes), greedy, on an open and a copying prompt, in turn (chain first, then tree first), timed
    on this machine. Trees are the presets' choice only where they decoded TREE_MARGIN faster: a tree verifies more
    rows and runs every drafter, which pays only where a forward's extra rows are nearly free here."""
    from ui.settings import Settings

    nodes = Settings().tree_nodes if nodes is None else nodes
    if nodes <= 0 or not chain or not engine.supports_trees:
        return TreeChoice(nodes=0, why="chains: trees are off for this model" if nodes > 0 and chain else "")
    done = {0: [0, 0.0], nodes: [0, 0.0]}
    prompts = [target.encode_chat([{"role": "user", "content": text}]) for text in TREE_PROBE_PROMPTS]
    for n in (0, nodes):  # a first answer pays one-off costs (buffers, a drafter's first call): not timed
        decode_time(engine, prompts[0], chain, n, n_new=8)
    for i, prompt in enumerate(prompts):
        for n in ((0, nodes) if i % 2 == 0 else (nodes, 0)):
            tokens, seconds = decode_time(engine, prompt, chain, n)
            done[n][0] += tokens
            done[n][1] += seconds
    chain_tps, tree_tps = (done[n][0] / max(done[n][1], 1e-9) for n in (0, nodes))
    return choose_trees(nodes, chain_tps, tree_tps)


def choose_trees(nodes: int, chain_tps: float, tree_tps: float) -> TreeChoice:
    """Trees of `nodes` where they decoded TREE_MARGIN faster than the chain, else chains; the why in numbers."""
    measured = f"{tree_tps:.0f} tok/s in trees of {nodes} nodes against {chain_tps:.0f} as a chain on the load's probe"
    if tree_tps >= TREE_MARGIN * chain_tps:
        return TreeChoice(nodes, chain_tps, tree_tps, f"trees: {measured}")
    return TreeChoice(0, chain_tps, tree_tps, f"chains: {measured} (trees only at {TREE_MARGIN:.2f}x or more)")
