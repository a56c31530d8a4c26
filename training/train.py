"""Train the draft head of the embedded model: `python -m training.train`.

Makes (or reuses, from the cache directory) the training data of `data.py`, picks the draft vocabulary (the
target tokens most often predicted in that data), standardises the features, and trains with the training-time
test of `unroll.py` for a fixed number of epochs (or until --max-minutes). Writes safetensors + json beside each
other (default: the shipped assets/draft_head/ files). Fixed seed; the data and batch order are deterministic,
threads aside.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.draft.head.net import DraftHead, HeadConfig, bf16_fingerprint, save_head, target_fingerprint
from engine.load.dtype import CHOICES as DTYPES
from training.data import DataParams, data_path, load_or_build
from training.unroll import step_loss, unroll

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "assets" / "draft_head" / "smollm2-135m-instruct.safetensors"
HELD_OUT = [ROOT / "assets" / "prompts" / name
            for name in ("heldout.jsonl", "unseen.jsonl", "all.jsonl", "fresh.jsonl")]


def pick_vocab(records: list[dict], size: int, vocab: int, eos: set[int]) -> torch.Tensor:
    """The `size` target tokens most often predicted (top-1 labels), then most often seen; end-of-turn first."""
    counts = torch.zeros(vocab, dtype=torch.float64)
    for r in records:
        lab = r["top_ids"][r["first_label"]:, 0].long()
        counts.index_add_(0, lab, torch.full(lab.shape, 10.0, dtype=torch.float64))
        counts.index_add_(0, r["tokens"].long(), torch.ones(len(r["tokens"]), dtype=torch.float64))
    for e in eos:
        counts[e] = float("inf")
    return torch.sort(counts.topk(size).indices).values


def feature_stats(records: list[dict], cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-dimension mean and spread of the chosen layers, skipping position 0 (the attention-sink outlier)."""
    rows = torch.cat([r["feats"][1:, cols].float() for r in records[:: max(1, len(records) // 200)]])
    return rows.mean(0), rows.std(0).clamp(min=1e-3)


def batches(records: list[dict], max_tokens: int, gen: torch.Generator) -> list[list[int]]:
    """Records grouped by length into batches of about max_tokens padded tokens, in a seeded random order."""
    order = sorted(range(len(records)), key=lambda i: len(records[i]["tokens"]))
    out, cur = [], []
    for i in order:
        width = max([len(records[j]["tokens"]) for j in cur + [i]])
        if cur and width * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return [out[i] for i in torch.randperm(len(out), generator=gen).tolist()]


def collate(records: list[dict], idx: list[int], cols: torch.Tensor):
    width = max(len(records[i]["tokens"]) for i in idx)
    n, k = len(idx), records[idx[0]]["top_ids"].shape[1]
    tokens = torch.zeros(n, width, dtype=torch.long)
    feats = torch.zeros(n, width, len(cols))
    top_ids = torch.zeros(n, width, k, dtype=torch.long)
    top_p = torch.zeros(n, width, k)
    labelled = torch.zeros(n, width, dtype=torch.bool)
    for b, i in enumerate(idx):
        r = records[i]
        L = len(r["tokens"])
        tokens[b, :L] = r["tokens"].long()
        feats[b, :L] = r["feats"][:, cols].float()
        top_ids[b, :L] = r["top_ids"].long()
        top_p[b, :L] = r["top_p"].float()
        labelled[b, r["first_label"]:L] = True
    return tokens, feats, top_ids, top_p, labelled


def shifted(t: torch.Tensor, j: int, fill=0) -> torch.Tensor:
    """t[:, j:] padded at the end: the value at base position t for draft step j+1."""
    if j == 0:
        return t
    pad = torch.full((t.shape[0], j) + tuple(t.shape[2:]), fill, dtype=t.dtype)
    return torch.cat([t[:, j:], pad], dim=1)


def run_epoch(head, records, batch_list, cols, t2d, n_steps, weights, opt=None, sched=None, bar=None, deadline=None,
              dropout: float = 0.0, gen: torch.Generator | None = None):
    """One pass; trains when opt is given. Returns per-step (loss, accuracy)."""
    tot = torch.zeros(n_steps, 3)
    for idx in batch_list:
        if deadline is not None and time.time() > deadline:
            break
        tokens, feats, top_ids, top_p, labelled = collate(records, idx, cols)
        with torch.set_grad_enabled(opt is not None):
            logits = unroll(head, feats, tokens, n_steps, dropout=dropout if opt is not None else 0.0,
                            gen=gen)
            loss = 0.0
            for j, lg in enumerate(logits):
                l_sum, correct, n = step_loss(lg, shifted(top_ids, j), shifted(top_p, j), t2d,
                                              shifted(labelled, j, False))
                loss = loss + weights[j] * l_sum / n.clamp(min=1)
                tot[j] += torch.tensor([float(l_sum.detach()), float(correct), float(n)])
        if opt is not None:
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(acc1=f"{tot[0, 1] / tot[0, 2].clamp(min=1):.3f}",
                            accN=f"{tot[-1, 1] / tot[-1, 2].clamp(min=1):.3f}")
    return [(float(t[0] / t[2].clamp(min=1)), float(t[1] / t[2].clamp(min=1))) for t in tot]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Train the EAGLE-style draft head of the embedded model.")
    ap.add_argument("--target", default="embedded", help="target model (the head is trained for this one)")
    ap.add_argument("--dtype", choices=DTYPES, default="float32",
                    help="the target's weights while making the data (default float32, as the shipped head was "
                         "made; auto: bfloat16 where this CPU computes it natively). The data is cached per dtype; "
                         "the head runs on the model loaded in either dtype")
    ap.add_argument("--data", type=Path, nargs="+", default=None, help="training data files, one per part "
                    "(default: in the cache directory; made when missing)")
    ap.add_argument("--parts", type=int, default=4, help="disjoint slices of prompts and text to train on")
    ap.add_argument("--n-topic", type=int, default=DataParams.n_topic, help="chat prompts per part")
    ap.add_argument("--n-copy", type=int, default=DataParams.n_copy, help="copy-style prompts per part")
    ap.add_argument("--max-new-tokens", type=int, default=DataParams.max_new_tokens,
                    help="length cap of each self-distilled answer")
    ap.add_argument("--doc-tokens", type=int, default=DataParams.doc_tokens, help="local text tokens per part")
    ap.add_argument("--dropout", type=float, default=0.1, help="dropout on the head's input features (training)")
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="weights file (.safetensors; .json beside it)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-minutes", type=float, default=0.0, help="stop training after this long (0: no limit)")
    ap.add_argument("--steps", type=int, default=3, help="training-time test depth (draft positions trained)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-tokens", type=int, default=1024)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--layers", type=int, nargs=3, default=list(HeadConfig.layers),
                    help="target hidden_states indices the head reads (low, middle, high; from data.data_layers)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--limit-records", type=int, default=0, help="use only this many records (a quick check)")
    return ap.parse_args(argv)


def load_target(name: str, dtype: str):
    from engine.load.models import load_model

    # prepacked linears are fine here: the target only runs under inference_mode (data.py), and only its embedding
    # table is read (a table, never a packed linear's weight)
    target = load_model(name, device="cpu", dtype=dtype)
    print(f"target {name}: {target.dtype} ({target.dtype_reason})")
    return target


def load_records(args: argparse.Namespace, target) -> tuple[list[dict], list[int]]:
    """Every part's records (made where the cache has none of them), and the target layers their features hold."""
    from engine.load.models import cache_dir

    records, layers = [], None
    for part in range(args.parts):
        params = DataParams(n_topic=args.n_topic, n_copy=args.n_copy, max_new_tokens=args.max_new_tokens,
                            doc_tokens=args.doc_tokens, part=part)
        embed = target.model.get_input_embeddings().weight
        # per exact table: the float32 and bfloat16 loads of a model hash apart, so their data never mix
        path = data_path(cache_dir() / "draft-head" / target_fingerprint(embed), part)
        data = load_or_build(args.data[part] if args.data else path, target, params, HELD_OUT)
        records += data["records"]
        layers = data["layers"]
    return records, layers


def split(records: list[dict], gen: torch.Generator) -> tuple[list[dict], list[dict]]:
    """(train, val): a seeded thirtieth of the records, at least one, held out for validation."""
    perm = torch.randperm(len(records), generator=gen).tolist()
    n_val = max(1, len(records) // 30)
    return [records[i] for i in perm[n_val:]], [records[i] for i in perm[:n_val]]


def head_config(args: argparse.Namespace, target) -> HeadConfig:
    embed = target.model.get_input_embeddings().weight.detach()
    text_cfg = target.model.config
    return HeadConfig(hidden=int(text_cfg.hidden_size), target_vocab=int(embed.shape[0]),
                      draft_vocab=args.draft_vocab, layers=tuple(args.layers),
                      rope_theta=float(text_cfg.rope_parameters["rope_theta"]), rms_eps=float(text_cfg.rms_norm_eps),
                      target_fingerprint=target_fingerprint(embed), target_fingerprint_bf16=bf16_fingerprint(embed))


def build_head(cfg: HeadConfig, target, layers: list[int], train: list[dict]):
    """(head, cols, t2d): a new head with its draft vocabulary and feature statistics taken from the training
    records, the feature columns of its layers, and the map of target tokens to draft ones (-1: none)."""
    embed = target.model.get_input_embeddings().weight.detach()
    layer_pos = [list(layers).index(i) for i in cfg.layers]
    cols = torch.cat([torch.arange(p * cfg.hidden, (p + 1) * cfg.hidden) for p in layer_pos])
    head = DraftHead(cfg)
    head.d2t.copy_(pick_vocab(train, cfg.draft_vocab, cfg.target_vocab, target.eos_ids()))
    mu, sigma = feature_stats(train, cols)
    head.feat_mu.copy_(mu)
    head.feat_sigma.copy_(sigma)
    head.attach_target(embed)
    t2d = torch.full((cfg.target_vocab,), -1, dtype=torch.long)
    t2d[head.d2t] = torch.arange(cfg.draft_vocab)
    return head, cols, t2d


def label_coverage(t2d: torch.Tensor, val: list[dict]) -> float:
    """The share of the validation labels (the target's top-1 tokens) that the draft vocabulary holds."""
    cover = sum(float((t2d[r["top_ids"][r["first_label"]:, 0].long()] >= 0).float().sum()) for r in val)
    return cover / sum(len(r["tokens"]) - r["first_label"] for r in val)


@dataclass
class Schedule:
    """The optimiser, its learning-rate schedule, the batches of an epoch, and when training must stop."""

    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    n_batches: int
    deadline: float | None  # time.time() past which no batch starts (None: no time limit)


def schedule(head: DraftHead, train: list[dict], args: argparse.Namespace) -> Schedule:
    """AdamW, with a linear warm-up over a thirtieth of the steps, then a cosine to zero."""
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.95))
    n_batches = len(batches(train, args.batch_tokens, torch.Generator().manual_seed(0)))
    total = n_batches * args.epochs
    warm = max(1, total // 30)
    deadline = time.time() + args.max_minutes * 60 if args.max_minutes > 0 else None
    t_begin = time.time()

    def progress(step: int) -> float:
        """Share of training done: by steps, or by time when a time limit ends it sooner (cosine still ends)."""
        done = step / total
        if deadline is not None:
            done = max(done, (time.time() - t_begin) / (deadline - t_begin))
        return min(1.0, done)

    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * progress(s))))
    return Schedule(opt=opt, sched=sched, n_batches=n_batches, deadline=deadline)


def train_epochs(head: DraftHead, train: list[dict], val: list[dict], cols: torch.Tensor, t2d: torch.Tensor,
                 args: argparse.Namespace, plan: Schedule, gen: torch.Generator) -> tuple[list, int]:
    """Up to args.epochs passes over the training records, each followed by one over the validation records.
    Returns the last validation's per-step (loss, accuracy) and the epochs run."""
    from tqdm import tqdm

    weights = [0.8 ** j for j in range(args.steps)]
    val_batches = batches(val, args.batch_tokens, torch.Generator().manual_seed(1))
    for epoch in range(args.epochs):
        head.train()
        with tqdm(total=plan.n_batches, desc=f"epoch {epoch + 1}/{args.epochs}", unit="batch") as bar:
            tr = run_epoch(head, train, batches(train, args.batch_tokens, gen), cols, t2d, args.steps, weights,
                           plan.opt, plan.sched, bar, plan.deadline, args.dropout, gen)
        head.eval()
        va = run_epoch(head, val, val_batches, cols, t2d, args.steps, weights)
        print(f"epoch {epoch + 1}: train acc/pos {[round(a, 3) for _, a in tr]}  "
              f"val loss/pos {[round(l, 3) for l, _ in va]}  val acc/pos {[round(a, 3) for _, a in va]}",
              flush=True)
        if plan.deadline is not None and time.time() > plan.deadline:
            print("time limit reached")
            break
    return va, epoch + 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    t_start = time.time()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    target = load_target(args.target, args.dtype)
    records, layers = load_records(args, target)
    t_data = time.time() - t_start
    if args.limit_records:
        records = records[: args.limit_records]
    train, val = split(records, gen)
    cfg = head_config(args, target)
    head, cols, t2d = build_head(cfg, target, layers, train)
    cover = label_coverage(t2d, val)
    print(f"data: {len(train)} train / {len(val)} val records, "
          f"{sum(len(r['tokens']) for r in records)} tokens, draft vocab covers {cover:.3f} of val labels")
    plan = schedule(head, train, args)
    t_train = time.time()
    va, epochs_run = train_epochs(head, train, val, cols, t2d, args, plan, gen)
    cfg.extra = {"val_acc_per_step": [round(a, 4) for _, a in va], "epochs_run": epochs_run,
                 "train_records": len(train), "data_seconds": round(t_data), "seed": args.seed,
                 "train_seconds": round(time.time() - t_train), "threads": torch.get_num_threads(),
                 "draft_vocab_coverage": round(cover, 4), "parts": args.parts, "dropout": args.dropout,
                 "lr": args.lr, "weight_decay": args.weight_decay, "batch_tokens": args.batch_tokens,
                 "target_dtype": target.dtype}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_head(head, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB) in {time.time() - t_start:.0f} s total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
