"""draft-head: an EAGLE-style head that reads the target's hidden states (llama.cpp's draft-eagle3 in spirit).

The head asks the target for three hidden layers (`hidden_layers`, llama_set_embeddings_layer_inp's analog);
after every target forward `process()` stores each row's features by (sequence, position), together with the
row's token. Rows of a verification batch past the accepted prefix are overwritten by the next forward at those
positions, and a checkpoint restore is followed by a replay batch over the same positions, so the features at
the confirmed positions are always the ones of the confirmed tokens, whatever rollback path the target took.

The head's own KV cache per sequence holds one entry per confirmed position t, made from (feature of t-1,
token t). At `draft()` it catches up: it keeps the longest prefix whose tokens agree with the confirmed ones
(so it is rolled back with the target), adds entries for the new positions up to id_last's, then drafts
token after token from its own features; the entries of draft tokens are dropped after drafting. Every
sequence that is still drafting advances in one batched head step; `p_min` stops a sequence early.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.batch import Batch
from engine.draft.base import Drafter, DraftRequest, DraftStreams, choose_draft
from engine.draft.features import copy_prefix
from engine.draft.head.net import DraftHead, HeadConfig, fingerprint_matches, load_head
from engine.draft.head.state import HeadSeqState
from engine.draft.head.tree import HeadTreeParams, StepCost, TreeSeed, grow_many
from engine.forward.mapped import drop_resident
from engine.prefix import common_prefix

DEFAULT_WEIGHTS = Path(__file__).resolve().parents[3] / "assets" / "draft_head" / "smollm2-135m-instruct.safetensors"


@dataclass
class DraftHeadParams:
    weights: Path = DEFAULT_WEIGHTS  # the head's safetensors file (its .json config beside it)
    top_k: int = 10  # candidates kept in q when the target samples (llama.cpp's draft sampler keeps 10)
    grow: int = 256  # positions added at a time to the per-sequence stores
    # stop drafting below this top probability, when the request leaves it to the drafter: the value at which
    # the shipped head was fastest on the held-out prompts (training.eval --p-min ...; docs/draft-head.md)
    p_min: float = 0.3
    tree: HeadTreeParams = field(default_factory=HeadTreeParams)  # dynamic trees, in tree mode
    # a forward with at least this many rows of one sequence, extending the head's entries, is a prompt's
    # prefill: the head makes their entries then (process), not in the first draft. With four open slots the
    # first draft read the prompts, up to a round's time that every slot waited for
    prefill_rows: int = 16


class DraftHeadDrafter(Drafter):
    name = "draft-head"
    needs_model = True
    first_entry = 0  # head KV entries never attended to at the start of a sequence (HeadSeqState.first)
    gives_q = True  # its q is over the target's own vocabulary

    def __init__(self, target=None, params: DraftHeadParams | None = None, head: DraftHead | None = None):
        if target is None:
            raise ValueError("draft-head needs the target model (its embedding table and hidden states)")
        self.params = params or DraftHeadParams()
        if head is None:
            if not Path(self.params.weights).is_file():
                raise ValueError(f"draft-head weights not found: {self.params.weights}")
            head = load_head(Path(self.params.weights))
        check_config_matches(head.cfg, target)
        # the head runs beside the target's embedding table, which it reads, and so do its stores and indices
        self.device = target.model.get_input_embeddings().weight.device
        head.to(self.device)
        # the table as the target holds it (bfloat16 for a bfloat16 target): the head converts only the rows it
        # uses, its LM head's draft-vocabulary rows once and each step's looked-up rows
        head.attach_target(target.model.get_input_embeddings().weight)
        head.for_inference(target.model.get_input_embeddings().weight.dtype,
                           integer=getattr(target, "dtype", "") == "int8")
        drop_resident(target.model.get_input_embeddings().weight)  # the checksum read all of a mapped table
        self.head = head.eval()
        self.hidden_layers = tuple(head.cfg.layers)
        self.states: dict[int, HeadSeqState] = {}
        # forwards' features not yet sorted into the sequences' stores: (seq, pos, token of each row, features
        # [rows, n_feat]). A slot that rests or that the gate skips is not drafted for, and noting each row of a
        # forward of four slots where it belongs cost every round its share; they are sorted when the head next
        # drafts, for all forwards at once (or every `sort_every` forwards: each holds its hidden states in memory)
        self.unsorted: list[tuple[list[int], list[int], list[int], torch.Tensor]] = []
        self.sort_every = 64
        self.streams = DraftStreams()  # per-seq temperature, seed and random stream
        self.step_cost = StepCost()  # tree mode: what a depth step of the head costs and gives (tree.py)

    def _sort(self) -> None:
        """Write the forwards' features into their sequences' stores; where a position was forwarded twice (a
        rejected draft, then the target's token), the later forward's row is the one kept."""
        if not self.unsorted:
            return
        parts, self.unsorted = self.unsorted, []
        with torch.inference_mode():  # the features are the forward's inference tensors
            if len(parts) == 1 and self._write_runs(*parts[0]):
                return
            seqs, pos, toks = (torch.tensor([x for part in parts for x in part[i]], device=self.device)
                               for i in range(3))
            feats = torch.cat([part[3] for part in parts])
            order = torch.arange(len(pos), device=self.device)
            for seq in seqs.unique().tolist():
                mine = order[seqs == seq]
                if len(parts) == 1:  # a forward holds a position of a sequence once: nothing to choose between
                    self._state(seq).write(pos[mine], toks[mine], feats[mine], self.params.grow)
                    continue
                where, slot = torch.unique(pos[mine], return_inverse=True)
                last = torch.zeros(len(where), dtype=torch.long, device=self.device).scatter_reduce_(0, slot, mine, "amax",
                                                                                 include_self=False)
                self._state(seq).write(where, toks[last], feats[last], self.params.grow)

    def _write_runs(self, seqs: list[int], pos: list[int], toks: list[int], feats: torch.Tensor) -> bool:
        """One forward whose rows of each sequence are consecutive rows at consecutive positions (a round's rows,
        a prefill, a tree's kept path): each sequence's rows written as one slice, without the index tensors of
        the general case, which cost a quarter of a millisecond of every draft of the head. False, and nothing
        written, for any other forward."""
        runs, start = [], 0  # (seq, first row, rows)
        for r in range(1, len(seqs) + 1):
            if r == len(seqs) or seqs[r] != seqs[start] or pos[r] != pos[r - 1] + 1:
                runs.append((seqs[start], start, r - start))
                start = r
        if len({seq for seq, _, _ in runs}) != len(runs):
            return False
        for seq, row, n in runs:
            self._state(seq).write_run(pos[row], toks[row:row + n], feats[row:row + n], self.params.grow)
        return True

    def _state(self, seq: int) -> HeadSeqState:
        if seq not in self.states:
            c = self.head.cfg
            self.states[seq] = HeadSeqState(c.hidden * len(c.layers), c.n_kv_heads, c.head_dim, self.first_entry,
                                            self.device)
        return self.states[seq]

    # ---- lifecycle --------------------------------------------------------------------------------------

    def begin(self, seq: int, prompt: list[int]) -> None:
        st = self._state(seq)
        st.kv_tokens = []  # features stay: a reused prompt prefix is not forwarded again
        self.streams.restart(seq)

    def retune(self, seq: int, temp: float, seed: int) -> None:
        self.streams.retune(seq, temp, seed)

    def seq_rm(self, seq: int) -> None:
        # the engine calls this before reusing a slot's cached prefix, whose features were made then: keep them
        if seq in self.states:
            self.states[seq].kv_tokens = []
        self.streams.forget(seq)

    def seq_cp(self, src: int, dst: int, n: int) -> None:
        # the shared prefix is never forwarded for dst: without its features the head would draft blind there
        if src not in self.states or n <= 0:
            return
        self._sort()
        copy_prefix(self._state(dst), self._state(src), n, self.params.grow)

    def process(self, batch: Batch, result=None) -> None:
        if result is None or result.hidden is None:
            return
        self.unsorted.append((list(batch.seq), list(batch.pos), list(batch.tokens),
                              result.hidden_of(self.hidden_layers).to(self.device)))
        if len(batch.seq) < self.params.prefill_rows:
            if len(self.unsorted) >= self.sort_every:
                self._sort()
            return
        self._sort()
        # a prompt's prefill (many rows that extend the head's entries): its entries are made now, while the
        # target reads the prompt, instead of in the first round's draft, which every slot waits for
        by_seq: dict[int, list[int]] = {}
        for row, seq in enumerate(batch.seq):
            by_seq.setdefault(seq, []).append(row)
        reading = []
        for seq, rows in by_seq.items():
            st = self._state(seq)
            if len(rows) >= self.params.prefill_rows and batch.pos[rows[0]] == len(st.kv_tokens) \
                    and not batch.has_tree():
                reading.append((seq, st.kv_tokens + [batch.tokens[r] for r in rows]))
        if reading:
            with torch.inference_mode():
                self._make_entries(reading, query=False)

    # ---- drafting ---------------------------------------------------------------------------------------

    def _attend(self, st: HeadSeqState, q: torch.Tensor) -> torch.Tensor:
        """One query [heads, d] over all of the sequence's KV entries -> [heads*d]."""
        k = st.k.transpose(0, 1)[None]  # [1, kv_heads, n, d]: GQA inside SDPA, no copy per query head
        v = st.v.transpose(0, 1)[None]
        out = F.scaled_dot_product_attention(q[None, :, None], k, v, enable_gqa=True)
        return out.reshape(-1)

    def _catch_up(self, requests: list[DraftRequest]) -> list[torch.Tensor]:
        """Bring every sequence's KV up to id_last's position; return each one's (feature, query) there."""
        fused, lasts, q = self._make_entries([(r.seq, r.prompt + [r.id_last]) for r in requests], query=True)
        return fused[lasts], q

    def _make_entries(self, wanted: list[tuple[int, list[int]]], query: bool):
        """Make each sequence's KV entries up to the end of its confirmed tokens, from the features the target
        gave. query: the last token's entry is remade (id_last's, whose feature row may have changed) and its
        query returned with it. Returns (fused features of the new rows, each sequence's last row, q)."""
        head, dev = self.head, self.device
        raw, known, toks, pos, spans = [], [], [], [], []
        self._sort()
        for seq, confirmed in wanted:
            st = self._state(seq)
            n = common_prefix(st.kv_tokens, confirmed, limit=len(confirmed) - 1 if query else None)
            del st.kv_tokens[n:]
            st.reserve(len(confirmed), self.params.grow)
            # entry t is made from the feature of t - 1, if that row's token is the confirmed one; at position
            # 0, or where a position was never forwarded, the feature is zero, as in training
            want = torch.tensor([confirmed[t - 1] if t >= 1 else -2 for t in range(n, len(confirmed))], device=dev)
            if n >= 1:  # positions n - 1 .. len - 2: one slice
                known.append(st.feat_tok[n - 1:len(confirmed) - 1] == want)
                raw.append(st.feats[n - 1:len(confirmed) - 1])
            else:
                prev = torch.arange(n - 1, len(confirmed) - 1, device=dev).clamp(min=0)
                known.append(st.feat_tok[prev] == want)
                raw.append(st.feats[prev])
            toks += confirmed[n:]
            pos.append(torch.arange(n, len(confirmed), device=dev))
            spans.append(len(confirmed) - n)
        known_t = torch.cat(known)
        fused = head.fuse(torch.cat(raw)) * known_t[:, None]
        lasts = torch.tensor(spans, device=dev).cumsum(0) - 1  # each sequence's last row: where its drafting starts
        toks_t = torch.tensor(toks, device=dev)
        if query:
            q, k, v = head.kv_then_q(fused, toks_t, torch.cat(pos), lasts)
        else:
            q, (k, v) = None, head.kv(fused, toks_t, torch.cat(pos))
        start = 0
        for (seq, _), n_new in zip(wanted, spans):
            self._state(seq).put_kv(k[start:start + n_new], v[start:start + n_new], toks[start:start + n_new])
            start += n_new
        return fused, lasts, q

    def _choose(self, r: DraftRequest, logits: torch.Tensor):
        """Pick a draft token from head logits [draft_vocab]; return (target id, p of top, p of it, full q)."""
        return choose_draft(r, logits, self.params.top_k, self.streams, self.head.d2t, self.head.cfg.target_vocab)

    @torch.inference_mode()
    def draft(self, requests: list[DraftRequest]) -> None:
        head = self.head
        for r in requests:
            r.result, r.result_p = [], []
            r.result_q = [] if r.want_q else None
        if not requests:
            return
        feat, q = self._catch_up(requests)
        base = {r.seq: len(self._state(r.seq).kv_tokens) for r in requests}  # entries of confirmed positions
        trees = [i for i, r in enumerate(requests) if r.tree_max > 0]
        if trees:  # tree mode: the head's first step, then a dynamic tree per sequence (tree.py)
            attn = torch.stack([self._attend(self._state(requests[i].seq), q[i]) for i in trees])
            g = head.finish(feat[trees], attn)
            logits = head.logits(g).float()
            states = [self._state(requests[i].seq) for i in trees]
            seeds = [TreeSeed(st.k, st.v, base[requests[i].seq], g[n], logits[n],
                              requests[i].model_tree_max or requests[i].tree_max,
                              requests[i].draft_max, requests[i].tree_min_score)
                     for n, (i, st) in enumerate(zip(trees, states))]
            token_seconds = max(requests[i].token_seconds for i in trees)  # the same batch for all of them
            for i, tree in zip(trees, grow_many(head, seeds, self.params.tree, self.step_cost, token_seconds)):
                requests[i].result_tree = tree
        live = [i for i, r in enumerate(requests) if r.tree_max == 0]
        feat, q = feat[live], q[live]
        while live:
            attn = torch.stack([self._attend(self._state(requests[i].seq), q[n]) for n, i in enumerate(live)])
            g = head.finish(feat, attn)
            logits = head.logits(g).float()
            keep = []
            for n, i in enumerate(live):
                r = requests[i]
                tok, p_top, p_tok, q_full = self._choose(r, logits[n])
                if p_top < r.p_min_or(self.params.p_min):
                    continue
                r.take(tok, p_tok, q_full)
                if len(r.result) < r.draft_max:
                    keep.append(n)
            if not keep:
                break
            live = [live[n] for n in keep]
            feat = g[keep]
            toks = torch.tensor([requests[i].result[-1] for i in live], device=self.device)
            pos = torch.tensor([base[requests[i].seq] + len(requests[i].result) - 1 for i in live], device=self.device)
            q, k, v = head.qkv(feat, toks, pos)
            for n, i in enumerate(live):
                self._state(requests[i].seq).put_kv(k[n:n + 1], v[n:n + 1], [requests[i].result[-1]])
        for r in requests:  # draft entries leave the head cache: next round remakes them from target features
            del self._state(r.seq).kv_tokens[base[r.seq]:]


def head_fits(target, weights: Path = DEFAULT_WEIGHTS) -> bool:
    """Whether the head in `weights` was trained for this target: its config alone is read, not its weights,
    so the UI can ask at every model load whether draft-head belongs in the default chain. No model: no fit."""
    config = Path(weights).with_suffix(".json")
    if getattr(target, "model", None) is None or not config.is_file():
        return False
    try:
        check_config_matches(HeadConfig.from_json(config.read_text()), target)
    except ValueError:
        return False
    return True


def check_config_matches(cfg: HeadConfig, target) -> None:
    """Refuse a head trained for another model: vocabulary, width and the embedding table must be the same (the
    table in float32 or rounded to bfloat16: a head serves the same model loaded in either dtype)."""
    emb = target.model.get_input_embeddings().weight
    n_layers = int(getattr(target.model.config, "num_hidden_layers", 0))
    if emb.shape[0] != cfg.target_vocab or emb.shape[1] != cfg.hidden:
        raise ValueError(f"draft-head was trained for a target with vocab {cfg.target_vocab} and hidden "
                         f"{cfg.hidden}; the loaded target has vocab {emb.shape[0]} and hidden {emb.shape[1]}")
    if max(cfg.layers) > n_layers:
        raise ValueError(f"draft-head reads hidden layer {max(cfg.layers)}; the target has {n_layers} layers")
    if not fingerprint_matches(cfg, emb):
        raise ValueError("draft-head was trained for another model (embedding table checksum differs)")
