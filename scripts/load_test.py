"""Load test of the real app at full size: many browser sessions at once, as a class would use it.

    python scripts/load_test.py --sessions 12 --max-new-tokens 48        # starts app.py (embedded model, 4 slots)
    python scripts/load_test.py --url http://127.0.0.1:7860/ --sessions 12   # an app already running on loopback

Each prompt first runs alone, one after another, for its own speedup. Then every session starts at once
(temperature 0 and 0.7 alternating; one cancels its answer mid-way, one closes its tab mid-way), and
afterwards a fresh session must be served. Prints the figures; exits 0 only if every regular session completed
losslessly with no hang and no error.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from loadclient import (connect, free_port, lossless, percentile, run_cancel, run_close_tab,  # noqa: E402
                        run_regular, speedup, start_app, stop_app, stop_reason, under_load, wait_ready)

PROMPTS = ROOT / "assets" / "prompts" / "all.jsonl"
TEMPS = (0.0, 0.7)  # alternating: greedy answers must be identical to plain decoding, sampled ones may differ


@dataclass
class Spec:
    role: str  # regular | cancel | close-tab
    name: str  # the prompt's id
    prompt: str
    temp: float


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=12, help="sessions at once (default 12)")
    p.add_argument("--max-new-tokens", type=int, default=48, help="answer length (default 48)")
    p.add_argument("--url", default=None, help="a running app on loopback; default: start app.py here")
    p.add_argument("--target", default="embedded", help="app.py --target when it is started here")
    p.add_argument("--parallel", type=int, default=4, help="app.py --parallel (slots) when started here")
    p.add_argument("--n-ctx", type=int, default=4096, help="app.py --n-ctx when started here")
    p.add_argument("--prompts", type=Path, default=PROMPTS, help="a jsonl of prompts (assets/prompts format)")
    p.add_argument("--timeout", type=float, default=1200, help="the whole run, seconds (default 1200)")
    p.add_argument("--answer-timeout", type=float, default=600, help="one session, queue wait included")
    args = p.parse_args(argv)
    if args.sessions < 3:
        p.error("--sessions must be >= 3: two of them are cancelled")
    if args.url and not is_loopback(args.url):
        p.error("--url must be on loopback (127.0.0.1, ::1 or localhost)")
    return args


def is_loopback(url: str) -> bool:
    host = urllib.parse.urlparse(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def load_prompts(path: Path) -> list[tuple[str, str]]:
    """(id, first user message) of each row: a chat turn is what a visitor sends."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = []
    for r in rows:
        text = r.get("prompt") or next(m["content"] for m in r["messages"] if m["role"] == "user")
        out.append((str(r.get("id", len(out))), text))
    return out


def plan(prompts: list[tuple[str, str]], n: int) -> list[Spec]:
    """n sessions: prompts in turn, temperatures alternating; the second cancels, the third closes its tab."""
    specs = []
    for i in range(n):
        name, text = prompts[i % len(prompts)]
        role = {1: "cancel", 2: "close-tab"}.get(i, "regular")
        specs.append(Spec(role, name, text, TEMPS[i % len(TEMPS)]))
    return specs


def references(api, specs: list[Spec], max_new: int, answer_timeout: float, deadline: float) -> dict:
    """Each (prompt, temperature) of the regular sessions alone, one after another: its own speedup."""
    refs = {}
    for s in specs:
        key = (s.name, s.temp)
        if s.role != "regular" or key in refs:
            continue
        timeout = max(1.0, min(deadline - time.monotonic(), answer_timeout))
        refs[key] = run_regular(api, s.prompt, s.temp, max_new, timeout)
        o = refs[key]
        print(f"  alone {s.name:<14} t={s.temp}: {o.tokens} tokens, speedup {fmt(speedup(o.summary), 'x')}, "
              f"{'lossless' if lossless(o.summary) else 'differs' if o.answered else 'NOT ANSWERED'}"
              f"{', labelled under load' if under_load(o.summary) else ''}", flush=True)
    return refs


def run_one(api, s: Spec, max_new: int, timeout: float, start: threading.Barrier):
    if s.role == "cancel":  # longer answers, so that the cancel surely lands mid-answer
        return run_cancel(api, s.prompt, s.temp, 4 * max_new, timeout, start)
    if s.role == "close-tab":
        return run_close_tab(api, s.prompt, s.temp, 4 * max_new, timeout, start)
    return run_regular(api, s.prompt, s.temp, max_new, timeout, start)


def load_phase(api, specs: list[Spec], max_new: int, deadline: float) -> tuple[list, float]:
    """Every session at once: each makes its client, they meet at a barrier, then all submit. Returns the
    outcomes in plan order and the wall seconds from the common start to the last end."""
    began = []
    start = threading.Barrier(len(specs), action=lambda: began.append(time.monotonic()), timeout=120)
    timeout = max(1.0, deadline - time.monotonic())
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = [pool.submit(run_one, api, s, max_new, timeout, start) for s in specs]
        wait(futures, timeout=timeout + 60)
    wall = time.monotonic() - (began[0] if began else time.monotonic())
    return [f.result() for f in futures], wall


def fmt(x, unit: str = "s") -> str:
    if x is None:
        return "–"
    return f"{x:.2f}×" if unit == "x" else f"{x:.1f} {unit}"


def session_line(s: Spec, o, ref) -> str:
    """One session: whether it queued (for its answer, then for its comparison), its first token, its end."""
    badge = "lossless" if lossless(o.summary) else "differs (sampled)" if o.answered else "–"
    alone = f", alone {fmt(speedup(ref.summary), 'x')}" if ref is not None else ""
    return (f"  {s.role:<9} {s.name:<14} t={s.temp:<3} queued={'yes' if o.waited else 'no ':<3} "
            f"again={'yes' if o.waited_again else 'no ':<3} ttft={fmt(o.ttft):<7} tokens={o.tokens:<3} "
            f"stop={stop_reason(o.summary) or '–':<7} {badge:<17} speedup={fmt(speedup(o.summary), 'x')}"
            f"{' (under load)' if under_load(o.summary) else ''}{alone}"
            f"{'  HUNG' if o.hung else ''}{'  ERROR ' + o.error if o.error else ''}")


def report(specs: list[Spec], outcomes: list, wall: float, refs: dict, slots: str) -> bool:
    """Print the figures; True when every regular session completed losslessly with no hang and no error."""
    pairs = list(zip(specs, outcomes))
    regular = [(s, o) for s, o in pairs if s.role == "regular"]
    completed = [(s, o) for s, o in regular if o.answered]
    greedy = [(s, o) for s, o in regular if s.temp == 0]
    hung = sum(o.hung for o in outcomes)
    errors = sum(bool(o.error) for o in outcomes)
    ttfts = [o.ttft for _, o in regular if o.ttft is not None]
    tokens = sum(o.tokens for _, o in completed)
    labelled = [(s, o) for s, o in completed if under_load(o.summary)]
    print("\nsessions:")
    for s, o in pairs:
        print(session_line(s, o, refs.get((s.name, s.temp)) if s.role == "regular" else None))
    print(f"\nsessions: {len(specs)} at once on {slots} ({len(regular)} regular, "
          f"{len(specs) - len(regular)} cancelled mid-answer: one by the client, one closing its tab)")
    print(f"completed: {len(completed)}/{len(regular)} · hung: {hung} · errors: {errors}")
    print(f"lossless at temperature 0: {sum(lossless(o.summary) for _, o in greedy)}/{len(greedy)}")
    print(f"queued for a slot before answering: {sum(o.waited for o in outcomes)} sessions; "
          f"queued again for the comparison's plain run: {sum(o.waited_again for o in outcomes)}")
    print(f"wall: {wall:.1f} s")
    print(f"time to first token: p50 {fmt(percentile(ttfts, 50))}, p95 {fmt(percentile(ttfts, 95))}")
    print(f"aggregate: {tokens} answer tokens / {wall:.1f} s = {tokens / wall if wall > 0 else 0:.1f} tok/s "
          f"(plain comparison runs not counted)")
    print(f"speedups labelled \"under load\": {len(labelled)} of {len(completed)}")
    for s, o in completed:
        if not under_load(o.summary):
            ref = refs.get((s.name, s.temp))
            alone = speedup(ref.summary) if ref is not None else None
            print(f"  unlabelled: {s.name} t={s.temp}: {fmt(speedup(o.summary), 'x')} in the test, "
                  f"{fmt(alone, 'x')} alone")
    ok_greedy = all(lossless(o.summary) for _, o in greedy)
    return len(completed) == len(regular) and ok_greedy and hung == 0 and errors == 0


def main(argv=None) -> int:
    args = parse_args(argv)
    t_begin = time.monotonic()
    deadline = t_begin + args.timeout
    proc = None

    def give_up(signum, frame):  # past the overall bound, whatever is still waiting: end it all, app included
        print(f"\nload_test: gave up after {args.timeout:.0f} s", flush=True)
        if proc is not None:
            stop_app(proc)
        os._exit(3)

    signal.signal(signal.SIGALRM, give_up)
    signal.alarm(int(args.timeout) + 60)
    try:
        url = args.url
        if url is None:
            port = free_port()
            log = Path(tempfile.mkdtemp(prefix="load_test-")) / "app.log"
            proc = start_app(["--target", args.target, "--port", str(port), "--parallel", str(args.parallel),
                              "--n-ctx", str(args.n_ctx)], log)
            url = f"http://127.0.0.1:{port}/"
            print(f"starting app.py --target {args.target} --parallel {args.parallel} (log: {log})", flush=True)
            wait_ready(url, proc, log, max(1.0, deadline - time.monotonic()))
            print(f"app ready after {time.monotonic() - t_begin:.0f} s", flush=True)
        url = url if url.endswith("/") else url + "/"
        api = connect(url)
        slots = f"{args.parallel} slots" if args.url is None else "the app's slots"
        specs = plan(load_prompts(args.prompts), args.sessions)
        print(f"each prompt alone first ({sum(s.role == 'regular' for s in specs)} regular sessions):", flush=True)
        refs = references(api, specs, args.max_new_tokens, args.answer_timeout, deadline)
        print(f"now {len(specs)} sessions at once…", flush=True)
        outcomes, wall = load_phase(api, specs, args.max_new_tokens,
                                    min(deadline, time.monotonic() + args.answer_timeout))
        ok = report(specs, outcomes, wall, refs, slots)
        fresh = run_regular(api, specs[0].prompt, 0.0, args.max_new_tokens,
                            max(1.0, min(args.answer_timeout, deadline - time.monotonic())), role="fresh")
        fresh_ok = fresh.answered and lossless(fresh.summary)
        print(f"fresh session afterwards: {'answered, lossless' if fresh_ok else 'NOT SERVED'} "
              f"({fresh.tokens} tokens, ttft {fmt(fresh.ttft)}, queued: {'yes' if fresh.waited else 'no'})")
        if proc is not None and proc.poll() is not None:
            print(f"the app exited with {proc.returncode}")
            ok = False
        ok = ok and fresh_ok
        print(f"total {time.monotonic() - t_begin:.0f} s · result: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1
    finally:
        signal.alarm(0)
        if proc is not None:
            stop_app(proc)


if __name__ == "__main__":
    sys.exit(main())
