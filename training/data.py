"""Training data for the draft head, made on this machine with no network.

Two sources, both run through the target itself:
* self-distillation: the target's greedy answers to the chat prompts of `prompts.py` (a batched greedy loop). The
  hidden states and the next-token distributions come from the generation itself, so nothing is run twice;
  these are exactly the contexts the head meets when it drafts for the target at temperature 0.
* offline text: paragraphs of Python's own documentation (pydoc_data) and of /usr/share/doc, run through the
  target in chunks; the labels are the target's distribution at every position, not the text's next token.

Per sequence we keep: the tokens, the target hidden states of `data_layers` (float16), and the target's top-K next
token ids and probabilities. Everything lands in one torch file under the cache directory (never in git).
"""

from __future__ import annotations

import gzip
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

from training.prompts import check_disjoint, training_prompts

TOP_K = 8  # target probabilities kept per position as the soft label


def data_layers(n_layers: int) -> tuple[int, ...]:
    """hidden_states indices stored (a head config picks three): a low, the middle, a high and the top layer
    (2, 15, 27, 30 for the embedded model's 30 layers)."""
    return tuple(sorted({min(2, n_layers), n_layers // 2, max(n_layers - 3, 0), n_layers}))


@dataclass
class DataParams:
    n_topic: int = 500  # template x topic chat prompts
    n_copy: int = 36  # copy / rewrite / summarise prompts over passages of local text
    max_new_tokens: int = 192  # length cap of each self-distilled answer
    gen_batch: int = 96  # prompts generated together (bigger batches use the CPU better, and memory)
    doc_tokens: int = 16384  # tokens of raw local text run through the target
    doc_chunk: int = 256  # tokens per raw text chunk
    seed: int = 1234  # prompt and passage choice
    part: int = 0  # which slice of the prompt and text lists (parts are disjoint; see prompts.training_prompts)


def _is_prose_file(p: Path) -> bool:
    return p.name.lower().startswith("readme") or p.suffix in (".md", ".txt") or p.name.endswith(".md.gz")


def local_texts(limit_chars: int = 2_000_000) -> list[str]:
    """Plain-text prose available offline: pydoc topics, then READMEs / markdown under /usr/share/doc."""
    texts = []
    try:
        import pydoc_data.topics as topics

        texts += [topics.topics[k] for k in sorted(topics.topics)]
    except ImportError:
        pass  # a Python without its docs: /usr/share/doc alone
    root = Path("/usr/share/doc")
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and _is_prose_file(p))
        for p in files:
            try:
                raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
                texts.append(raw.decode("utf-8"))
            except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
                continue  # binary or broken file: not prose
    out, total = [], 0
    for t in texts:
        if total > limit_chars:
            break
        out.append(t)
        total += len(t)
    return out


def _record(tokens, feats, probs_ids, probs_p, first_label: int) -> dict:
    return {"tokens": torch.as_tensor(tokens, dtype=torch.int32), "feats": feats.to(torch.float16),
            "top_ids": probs_ids.to(torch.int32), "top_p": probs_p.to(torch.float16), "first_label": first_label}


@torch.inference_mode()
def self_distill(target, prompt_ids: list[list[int]], params: DataParams, eos: set[int], progress=None) -> list[dict]:
    """Greedy answers of the target, with hidden states and top-K distributions at every answer position."""
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    records = []
    for start in range(0, len(order), params.gen_batch):
        group = [prompt_ids[i] for i in order[start:start + params.gen_batch]]
        records += _distill_group(target, group, params.max_new_tokens, eos)
        if progress is not None:
            progress.update(len(group))
    return records


def _distill_group(target, group: list[list[int]], max_new_tokens: int, eos: set[int]) -> list[dict]:
    """One left-padded batch decoded greedily by our own loop rather than HF generate: a row leaves the batch
    (and the KV cache) at its end of turn, so finished answers cost nothing, and only the stored layers and
    the top-K of the last position are kept per step (generate keeps every layer and full logits)."""
    from transformers import DynamicCache

    model = target.model
    layers = data_layers(model.config.num_hidden_layers)
    pad = int(getattr(target.tokenizer, "pad_token_id", None) or 0)
    width = max(len(p) for p in group)
    inp = torch.tensor([[pad] * (width - len(p)) + p for p in group])
    att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=inp, attention_mask=att, position_ids=pos, past_key_values=cache, use_cache=True,
                output_hidden_states=True, logits_to_keep=1)
    prefill = torch.cat([out.hidden_states[i] for i in layers], dim=-1)  # [B, width, layers*H]
    feats = [[prefill[b, width - len(p):]] for b, p in enumerate(group)]  # per row: chunks of feature rows
    tops: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in group]
    answers: list[list[int]] = [[] for _ in group]
    live = torch.arange(len(group))  # batch row -> group index
    for step in range(max_new_tokens):
        logits = out.logits[:, -1].float()
        top = torch.softmax(logits, dim=-1).topk(TOP_K, dim=-1)
        nxt = logits.argmax(-1)
        done = torch.zeros(len(live), dtype=torch.bool)
        for row, g in enumerate(live.tolist()):
            tok = int(nxt[row])
            tops[g].append((top.indices[row], top.values[row]))
            answers[g].append(tok)
            done[row] = tok in eos or step == max_new_tokens - 1
        if bool(done.all()):
            break
        keep = (~done).nonzero().flatten()
        if len(keep) < len(live):
            cache.batch_select_indices(keep)
            live, nxt, att = live[keep], nxt[keep], att[keep]
        att = torch.cat([att, torch.ones(len(live), 1, dtype=att.dtype)], dim=1)
        out = model(input_ids=nxt[:, None], attention_mask=att, position_ids=att.sum(-1, keepdim=True) - 1,
                    past_key_values=cache, use_cache=True, output_hidden_states=True, logits_to_keep=1)
        rows = torch.cat([out.hidden_states[i][:, -1] for i in layers], dim=-1)  # [live, layers*H]
        for row, g in enumerate(live.tolist()):
            feats[g].append(rows[row:row + 1])
    records = []
    for g, p in enumerate(group):
        n = len(answers[g])
        length = len(p) + n - 1  # positions with a hidden state: the last token is never fed back
        ids = torch.zeros(length, TOP_K, dtype=torch.long)
        pr = torch.zeros(length, TOP_K)
        ids[len(p) - 1:] = torch.stack([i for i, _ in tops[g]])
        pr[len(p) - 1:] = torch.stack([v for _, v in tops[g]])
        records.append(_record(p + answers[g][:n - 1], torch.cat(feats[g])[:length], ids, pr,
                               first_label=len(p) - 1))
    return records


@torch.inference_mode()
def text_features(target, texts: list[str], params: DataParams, progress=None) -> list[dict]:
    """Chunks of local text through the target: hidden states and the target's top-K at every position."""
    model = target.model
    layers = data_layers(model.config.num_hidden_layers)
    ids: list[int] = []
    for t in texts:
        ids += target.tokenizer(t, add_special_tokens=False)["input_ids"]
        if len(ids) >= params.doc_tokens * (params.part + 1):
            break
    ids = ids[params.doc_tokens * params.part:params.doc_tokens * (params.part + 1)]
    chunks = [ids[i:i + params.doc_chunk] for i in range(0, len(ids) - params.doc_chunk + 1, params.doc_chunk)]
    records = []
    for start in range(0, len(chunks), 8):
        x = torch.tensor(chunks[start:start + 8])
        out = model.model(input_ids=x, output_hidden_states=True)
        hs = out.hidden_states
        feats = torch.cat([hs[i] for i in layers], dim=-1)
        for b in range(x.shape[0]):
            logits = model.lm_head(hs[-1][b])
            top = torch.softmax(logits.float(), dim=-1).topk(TOP_K, dim=-1)
            records.append(_record(x[b].tolist(), feats[b], top.indices, top.values, first_label=0))
        if progress is not None:
            progress.update(x.shape[0])
    return records


DATA_VERSION = "v2"  # bump when prompts or records change: old cached files are then not reused


def data_path(root: Path, part: int) -> Path:
    """Cache file of one data part (root: a folder per target model)."""
    return root / f"data-{DATA_VERSION}-part{part}.pt"


def build(target, params: DataParams, held_out: list[Path]) -> dict:
    """All training records plus what they were made from."""
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(params.seed)
    texts = local_texts()
    prompts = training_prompts(texts, params.n_topic, params.n_copy, gen, params.part)
    check_disjoint(prompts, held_out)
    prompt_ids = [target.encode_chat([{"role": "user", "content": p["content"]}]) for p in prompts]
    with tqdm(total=len(prompt_ids), desc="self-distil answers", unit="prompt") as bar:
        records = self_distill(target, prompt_ids, params, target.eos_ids(), bar)
    with tqdm(total=params.doc_tokens // params.doc_chunk, desc="local text features", unit="chunk") as bar:
        records += text_features(target, texts, params, bar)
    layers = data_layers(target.model.config.num_hidden_layers)
    return {"records": records, "layers": layers, "prompts": [p["content"] for p in prompts],
            "params": params.__dict__}


def load_or_build(path: Path, target, params: DataParams, held_out: list[Path]) -> dict:
    """The cached data at `path`, made first when missing or made with other parameters (written atomically)."""
    if path.is_file():
        # tensors, numbers and strings only: a cache file is data, and pickle would run whatever code it names
        try:
            data = torch.load(path, weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
            print(f"{path} is not a data file this version reads ({type(e).__name__}): making it again")
            data = {}
        if data.get("params") == params.__dict__:
            return data
        if data:
            print(f"{path} was made with other data parameters: making it again")
    data = build(target, params, held_out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(data, tmp)
    tmp.rename(path)
    return data
