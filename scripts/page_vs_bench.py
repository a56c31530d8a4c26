"""The speedup the page shows against the bench's, prompt by prompt, with a headless browser on this machine.

    .venv/bin/python scripts/page_vs_bench.py --prompts assets/prompts/page_check.jsonl --max-new-tokens 96 \
        [--repeat 5]

Starts the app (the embedded model, one slot), sends each prompt from a fresh chat in Debian's Chromium with the
page's default settings, and reads the speedup of its comparison; then stops the app and runs the bench on the
same prompts with the page's chain (the n-grams and the draft head, in trees). Prints both per prompt (decode
speed only, as the page times it) and their ratio: the page's figure is fair when it stays near 1. A single
96-token run of either moves by a third on this kind of host, so --repeat R runs both R times in turn (the app
stopped while the bench runs) and compares the medians per prompt.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHAIN = "ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache,draft-head"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--parallel", "1"], cwd=ROOT,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2):
                return proc
        except OSError:
            time.sleep(1)
    proc.kill()
    raise RuntimeError(f"the app did not start:\n{log.read_text()[-2000:]}")


def page_speedups(url: str, prompts: list[dict], max_new: int) -> dict[str, float]:
    from playwright.sync_api import sync_playwright

    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.set_default_timeout(300_000)
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_selector("#msg textarea")
        box = page.locator("#max-new input[type=number]")
        box.fill(str(max_new))
        box.press("Enter")
        for row in prompts:
            page.locator("#clear-btn").click()
            page.wait_for_function("() => !document.querySelector('#summary .speedup')")
            page.locator("#msg textarea").fill(row["messages"][0]["content"])
            page.locator("#send-btn").click()
            page.wait_for_selector("#summary .speedup")
            text = page.locator("#summary .compare").inner_text()
            out[row["id"]] = float(re.search(r"([0-9.]+)\s*×", text).group(1))
            print(f"page  {row['id']:18s} {out[row['id']]:.2f}x  ({text.splitlines()[-1][:90]})", flush=True)
        browser.close()
    return out


def bench_speedups(prompts_path: Path, max_new: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "traces.csv"
        subprocess.run([sys.executable, "-m", "engine.bench", "--prompts", str(prompts_path), "--out", str(out),
                        "--max-new-tokens", str(max_new), "--tree", "on", "--spec", CHAIN], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        rows = [r for r in csv.DictReader(out.open()) if r["spec_decode"] == "on"]
    # decode only, as the page times it (from the first answer token on); the prompt's prefill is left out
    return {r["prompt_id"]: float(r["speedup_decode"]) for r in rows if r["speedup_decode"]}


def page_pass(prompts: list[dict], max_new: int) -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_app(port, Path(tmp) / "app.log")
        try:
            return page_speedups(f"http://127.0.0.1:{port}/", prompts, max_new)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=Path, default=ROOT / "assets" / "prompts" / "page_check.jsonl")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=1, help="passes of the page and of the bench, in turn")
    args = ap.parse_args()
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    pages: dict[str, list[float]] = {p["id"]: [] for p in prompts}
    benches: dict[str, list[float]] = {p["id"]: [] for p in prompts}
    for _ in range(args.repeat):
        for pid, x in page_pass(prompts, args.max_new_tokens).items():
            pages[pid].append(x)
        for pid, x in bench_speedups(args.prompts, args.max_new_tokens).items():
            benches[pid].append(x)
    print(f"{'prompt':20s} {'page':>6s} {'bench':>6s} {'page/bench':>10s}   (medians of {args.repeat}; runs: page | bench)")
    for pid in pages:
        if not pages[pid] or not benches[pid]:
            print(f"{pid:20s} missing: page {pages[pid]}, bench {benches[pid]}")
            continue
        pg, b = statistics.median(pages[pid]), statistics.median(benches[pid])
        runs = " ".join(f"{x:.2f}" for x in pages[pid]) + " | " + " ".join(f"{x:.2f}" for x in benches[pid])
        print(f"{pid:20s} {pg:6.2f} {b:6.2f} {pg / b:10.2f}   ({runs})")


if __name__ == "__main__":
    main()
