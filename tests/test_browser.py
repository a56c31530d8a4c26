"""The app in a real browser: python app.py (embedded model) driven by Debian's Chromium through Playwright.

Sends a copy prompt and checks the marks of accepted, bonus and rejected tokens, the acceptance chart and the
lossless badge; stops a long answer and sends another prompt that then works. Saves assets/screenshot.png.
On a projector's 1024x768 it types a message (Shift+Enter for a new line, Enter to send), hides and shows the
rejected drafts, and checks that nothing scrolls sideways; with SPECPLAY_SCREENSHOT_DIR set (docs/) it saves
that view there as screenshot-1024.png.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
SCREENSHOT = ROOT / "assets" / "screenshot.png"
SCREENSHOT_DIR_ENV = "SPECPLAY_SCREENSHOT_DIR"
PROJECTOR = {"width": 1024, "height": 768}
QUOTE_ASK = "Repeat the following text exactly, word for word:"
QUOTE = ("The quick brown fox jumps over the lazy dog. The dog sleeps in the warm sun while the fox runs into the "
         "forest to find its friends.")
START_TIMEOUT_S = 300  # model load + calibration on a busy 2-core machine
ANSWER_TIMEOUT_MS = 180_000
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"app.py exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(1)
    pytest.fail(f"app.py did not answer within {timeout} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("app") / "app.log"
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--n-ctx", "2048", "--parallel", "2",
                                 "--exempt-loopback"],  # the tests play the operator, in several tabs at once
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_http(url, proc, log, START_TIMEOUT_S)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def browser(server):
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    """A tab of its own for each test: a session with an empty chat, whatever the tests before it did."""
    pg = browser.new_page(viewport={"width": 1600, "height": 1000})
    pg.set_default_timeout(60_000)
    pg.goto(server, wait_until="domcontentloaded")
    pg.wait_for_selector("#msg textarea")
    yield pg
    pg.close()


def set_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def save_screenshot(page) -> None:
    """The whole page in one viewport (a fixed sidebar would end halfway down a full-page capture), with a
    tooltip open on a rejected token."""
    height = page.evaluate("() => document.documentElement.scrollHeight")
    page.set_viewport_size({"width": 1600, "height": min(int(height), 2400)})
    page.evaluate("() => { const s = document.querySelector('.sidebar-content'); if (s) s.scrollTop = 0; }")
    page.locator("#chat .tok-rej").nth(1).hover()
    time.sleep(0.5)  # let the plots settle after the resize
    SCREENSHOT.parent.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT))
    page.set_viewport_size({"width": 1600, "height": 1000})


def answers(page):
    return page.locator("#chat .msg-bot")


def wait_answer_done(page, n: int) -> None:
    """The n-th answer has its footer with a stop reason (a finished answer)."""
    try:
        page.wait_for_function(
            "n => { const a = document.querySelectorAll('#chat .msg-bot'); "
            "return a.length >= n && a[n - 1].querySelector('.meta') && "
            "a[n - 1].querySelector('.meta').textContent.includes('stop:'); }", arg=n, timeout=ANSWER_TIMEOUT_MS)
    except sync_api.TimeoutError:
        pytest.fail(f"answer {n} did not finish; chat: {page.locator('#chat').inner_text()[-600:]!r}; "
                    f"notice: {page.locator('#notice').inner_text()!r}")


def test_chat_marks_rounds_compares_and_stops(page):
    t0 = time.monotonic()
    page.locator("#adaptive input").uncheck()  # verify every draft: rejections are sure to happen
    set_number(page, "max-new", 48)
    page.get_by_role("button", name="Quote the key sentence").click()
    wait_answer_done(page, 1)
    first = answers(page).nth(0)
    for cls in ("tok-acc", "tok-bonus", "tok-rej"):
        assert first.locator(f".{cls}").count() > 0, f"no .{cls} token in the answer"
    page.wait_for_selector("#summary .badge", timeout=ANSWER_TIMEOUT_MS)
    badge = page.locator("#summary .badge").inner_text()
    assert "lossless" in badge, f"temperature 0 must be lossless, got: {badge}"
    page.wait_for_selector("#acc-plot .js-plotly-plot .bars path")
    assert "tok/s" in page.locator("#summary").inner_text()
    page.locator("#timeline tr.row-rej").first.wait_for()  # the timeline shows a rollback
    timeline = page.locator("#timeline").inner_text()
    # the page starts in trees only where the load's probe timed them faster than chains here, and says which
    nodes = int(page.locator("#tree-nodes input[type=number]").input_value())
    note = page.locator("#preset-note").inner_text()
    if nodes:
        assert "trees: " in note and "(tree: " in timeline, (note, timeline[:400])
        assert "branches freed by cell" in timeline or "seq_rm [" in timeline
    else:
        assert "chains: " in note and "seq_rm [" in timeline and "(tree: " not in timeline, (note, timeline[:400])
    save_screenshot(page)

    page.locator("#send-btn").click()  # empty message: a visible warning, nothing submitted
    page.wait_for_selector("#notice .notice-warn")
    assert answers(page).count() == 1

    set_number(page, "max-new", 600)  # a long answer, stopped after its first tokens
    page.locator("#msg textarea").fill("Write a long story about a lighthouse keeper and a storm.")
    page.locator("#send-btn").click()
    page.wait_for_function("() => document.querySelectorAll('#chat .msg-bot').length >= 2 && "
                           "document.querySelectorAll('#chat .msg-bot')[1].querySelectorAll('.tok').length >= 3")
    page.locator("#stop-btn").click()
    wait_answer_done(page, 2)
    assert "stop: stopped" in answers(page).nth(1).locator(".meta").inner_text()

    set_number(page, "max-new", 24)
    page.locator("#msg textarea").fill("Name three colours.")
    page.locator("#send-btn").click()
    wait_answer_done(page, 3)
    meta = answers(page).nth(2).locator(".meta").inner_text()
    assert "stop: eos" in meta or "stop: length" in meta, meta
    assert answers(page).nth(2).locator(".tok").count() > 0
    print(f"browser test: {time.monotonic() - t0:.1f} s after the page loaded")


def test_sessions_are_separate(page, browser, server):
    """Another tab is another session: it starts with an empty chat while the first keeps its answer."""
    set_number(page, "max-new", 8)
    page.locator("#msg textarea").fill("Name three colours.")
    page.locator("#send-btn").click()
    wait_answer_done(page, 1)
    other = browser.new_page()
    other.goto(server, wait_until="domcontentloaded")
    other.wait_for_selector("#chat .chat-empty")
    assert other.locator("#chat .msg-bot").count() == 0
    assert answers(page).count() == 1
    other.close()


def prefill_cells(browser, server: str, prompt: str) -> int:
    """A new visitor (its own browser context: its own cookies and session) sends `prompt` in step mode; the
    cells its first round's prefill wrote, as the KV view says."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    try:
        pg = context.new_page()
        pg.set_default_timeout(60_000)
        pg.goto(server, wait_until="domcontentloaded")
        pg.wait_for_selector("#msg textarea")
        pg.locator("#step-mode input").check()
        pg.locator("#msg textarea").fill(prompt)
        pg.locator("#send-btn").click()
        pg.wait_for_function("() => document.querySelector('#notice').innerText.includes('Step mode')")
        pg.locator("#step-btn").click()
        pg.get_by_role("tab", name="KV cache").click()
        pg.wait_for_function("() => document.querySelector('#kv').innerText.includes('prefill wrote')")
        caption = pg.locator("#kv .kv-caption").inner_text()
        pg.locator("#stop-btn").click()
        return int(caption.split("prefill wrote ")[1].split()[0])
    finally:
        context.close()


def test_a_second_visitor_reuses_nothing_of_the_firsts_prompt(page, server):
    """Two visitors, one prompt: each tab salts its prefixes with its own draw, so the second's prefill writes
    every prompt cell again (the server runs without --share-prefix-cache)."""
    prompt = "Repeat after me, word for word: the quick brown fox jumps over the lazy dog by the river bank."
    first = prefill_cells(page.context.browser, server, prompt)
    second = prefill_cells(page.context.browser, server, prompt)
    assert first > 20 and second == first, (first, second)


def sideways_scrollers(page) -> list[str]:
    """The page, the chat and the rounds table: those of them wider than the window or than their own box."""
    return page.evaluate(
        "() => { const out = []; const d = document.documentElement; "
        "if (d.scrollWidth > window.innerWidth) out.push(`page ${d.scrollWidth} > ${window.innerWidth}`); "
        "for (const sel of ['#chat .chat', '#timeline .timeline']) { const e = document.querySelector(sel); "
        "if (e && e.scrollWidth > e.clientWidth) out.push(`${sel} ${e.scrollWidth} > ${e.clientWidth}`); } "
        "return out; }")


def count(page, selector: str) -> int:
    return page.locator(selector).count()


def wait_count(page, selector: str, n: int) -> None:
    page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length === n", arg=[selector, n])


def projector_screenshot(page, tmp_path: Path) -> Path:
    """The top of the page with the answer in view, as a 1024x768 projector shows it."""
    folder = Path(os.environ.get(SCREENSHOT_DIR_ENV) or tmp_path)
    if not folder.is_absolute():
        folder = ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "screenshot-1024.png"
    page.evaluate("() => { window.scrollTo(0, 0); const s = document.querySelector('.sidebar-content'); "
                  "if (s) s.scrollTop = 0; }")
    page.screenshot(path=str(path))
    return path


@pytest.fixture
def projector(browser):
    """A tab at 1024x768, a session of its own."""
    pg = browser.new_page(viewport=PROJECTOR)
    pg.set_default_timeout(60_000)
    yield pg
    pg.close()


def test_projector_enter_sends_and_rejected_drafts_toggle(projector, server, tmp_path):
    """Shift+Enter breaks the line, Enter sends, a Send click in the same breath does not start a second answer,
    the toggle takes the rejected drafts out of the chat and puts them back, and nothing scrolls sideways."""
    pg = projector
    pg.goto(server, wait_until="domcontentloaded")
    msg = pg.locator("#msg textarea")
    msg.wait_for()
    pg.locator("#adaptive input").uncheck()  # verify every draft: rejections are sure to happen
    set_number(pg, "max-new", 48)

    msg.fill(QUOTE_ASK)
    msg.press("Shift+Enter")
    msg.press("Shift+Enter")
    pg.keyboard.insert_text(QUOTE)
    time.sleep(1)  # time for a wrongly sent message to show up
    assert msg.input_value() == f"{QUOTE_ASK}\n\n{QUOTE}"
    assert count(pg, "#chat .msg-user") == 0, "Shift+Enter sent the message"

    msg.press("Enter")
    pg.locator("#chat .msg-user").wait_for()
    pg.locator("#send-btn").click()  # while the answer streams: not a second turn
    wait_answer_done(pg, 1)
    # the page drops the click while its answer streams; a click that reaches the server before the page
    # knows (a loaded machine) is refused there with "still generating": a warning about that click, no turn
    notice = pg.locator("#notice").inner_text()
    assert count(pg, "#chat .msg-user") == 1, notice
    assert count(pg, "#notice .notice-warn") == 0 or "still generating" in notice, notice
    assert QUOTE_ASK in pg.locator("#chat .msg-user").inner_text() and msg.input_value() == ""

    # the comparison run redraws the chat as it streams: a redraw sent just before the toggle may land just
    # after it, so the toggle is checked once that run is over
    pg.wait_for_selector("#summary .badge", timeout=ANSWER_TIMEOUT_MS)
    rejected, accepted = count(pg, "#chat .tok-rej"), count(pg, "#chat .tok-acc")
    assert rejected > 0 and accepted > 0
    pg.locator("#show-rej input").uncheck()
    wait_count(pg, "#chat .tok-rej", 0)
    wait_count(pg, "#chat .rej-tag", 0)
    assert count(pg, "#chat .tok-acc") == accepted
    pg.locator("#show-rej input").check()
    wait_count(pg, "#chat .tok-rej", rejected)

    pg.locator("#timeline tr.row-rej").first.wait_for()
    assert sideways_scrollers(pg) == []
    shot = projector_screenshot(pg, tmp_path)
    assert shot.stat().st_size > 10_000


def test_an_api_client_streams_beside_a_browser_chat(browser, server):
    """The openai client streams an answer from /v1/chat/completions while a browser tab chats: both are
    lossless, and /metrics grew by exactly the tokens both gave out (the page's answer, the API's answer and its
    plain reference), the page's comparison's two runs counted apart as a measurement."""
    openai = pytest.importorskip("openai")
    import re
    import threading

    from prometheus_client.parser import text_string_to_metric_families

    def metrics() -> dict:
        with urllib.request.urlopen(server + "metrics", timeout=30) as r:
            text = r.read().decode()
        return {s.name + "".join(f"[{v}]" for v in s.labels.values()): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    def idle() -> dict:
        """/metrics once nothing generates or waits and the counters stood still for 2 s: an earlier test's
        comparison may still be running, and between its two runs no slot is busy."""
        deadline = time.monotonic() + 90
        last = None
        while time.monotonic() < deadline:
            m = metrics()
            if m["slots_busy"] == 0 and m["requests_waiting"] == 0 and m == last:
                return m
            last = m if m["slots_busy"] == 0 and m["requests_waiting"] == 0 else None
            time.sleep(2.0)
        return metrics()

    before = idle()
    api: dict = {}
    prompt = [{"role": "user", "content": f"{QUOTE_ASK}\n\n{QUOTE}"}]

    def stream() -> None:
        with openai.OpenAI(base_url=server + "v1", api_key="unused", max_retries=0, timeout=180) as client:
            parts, timings = [], None
            for chunk in client.chat.completions.create(model="embedded", messages=prompt, stream=True,
                                                        temperature=0, max_tokens=48):
                if chunk.choices:
                    parts.append(chunk.choices[0].delta.content or "")
                timings = getattr(chunk, "timings", None) or timings
            plain = client.chat.completions.create(model="embedded", messages=prompt, temperature=0, max_tokens=48,
                                                   extra_body={"speculative": False})
            api.update(text="".join(parts), timings=timings, plain=plain.choices[0].message.content,
                       plain_n=plain.usage.completion_tokens)

    tab = browser.new_page(viewport={"width": 1600, "height": 1000})
    tab.set_default_timeout(60_000)
    tab.goto(server, wait_until="domcontentloaded")
    tab.wait_for_selector("#msg textarea")
    set_number(tab, "max-new", 48)
    worker = threading.Thread(target=stream)
    tab.get_by_role("button", name="Quote the key sentence").click()
    worker.start()
    wait_answer_done(tab, 1)
    tab.wait_for_selector("#summary .badge", timeout=ANSWER_TIMEOUT_MS)
    worker.join(timeout=ANSWER_TIMEOUT_MS / 1000)
    summary = tab.locator("#summary").inner_text()
    tab.close()
    assert "lossless" in summary, summary
    assert api and api["text"] == api["plain"] and api["timings"]["draft_n"] > 0, api
    after = idle()
    page_n = int(re.search(r"speculative\s+(\d+) tokens", summary).group(1))
    given = page_n + api["timings"]["predicted_n"] + api["plain_n"]
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == given
    # the page's comparison times plain decoding and the speculative run again, both unseen: the same answer twice
    compared = "measurement_generation_tokens_total[compare]"
    assert after[compared] - before[compared] == 2 * page_n
    assert after["spec_decode_num_draft_tokens_total"] - before["spec_decode_num_draft_tokens_total"] > \
        api["timings"]["draft_n"]  # the page's answer drafted too


OPEN_ASK = "Describe a day in the life of a lighthouse keeper."
NARRATED = ("<b>Relay.</b>", "<b>Verify.</b>", "<b>Accept.</b>", "<b>Its own token.</b>", "<b>Cut the cache.</b>")


def walk_to(pg, wanted: str, max_steps: int) -> str:
    """Press Step until the step view holds `wanted` (a JS predicate on the #step element `s`); its HTML."""
    for _ in range(max_steps):
        before = pg.locator("#step").inner_text()
        if "Finished:" in before:
            pytest.fail(f"the answer ended before a round with {wanted}: {pg.locator('#chat').inner_text()[-400:]!r}")
        pg.locator("#step-btn").click()
        # the next round's view, not the old one under Gradio's progress line while the click is served
        pg.wait_for_function("b => { const n = t => { const m = t.match(/Round (\\d+)/); return m ? +m[1] : -1; }; "
                             "const t = document.querySelector('#step').innerText; "
                             "return n(t) > n(b) && !/processing|queue:/.test(t); }", arg=before)
        if pg.evaluate(f"() => {{ const s = document.querySelector('#step'); return Boolean({wanted}); }}"):
            return pg.locator("#step").inner_html()
    pytest.fail(f"no round with {wanted} in {max_steps} steps; last: {pg.locator('#step').inner_text()[:800]!r}")


def start_stepping(pg, preset: str, ask: str, temp: float = 0.0, rollback: str = "auto", tree_nodes: int = 0,
                   n_max: int = 16) -> None:
    """A new chat in step mode with a preset's drafters, its message sent: the first Step runs the prefill."""
    pg.locator("#stop-btn").click()  # the last walk's answer, still open in step mode
    time.sleep(0.5)
    pg.locator("#clear-btn").click()
    pg.locator("#preset").get_by_label(preset, exact=True).check()
    time.sleep(1.0)  # the preset's values reach the controls
    set_number(pg, "tree-nodes", tree_nodes)
    set_number(pg, "n-max", n_max)
    pg.locator("#adaptive input").uncheck()  # verify every draft: rejections come sooner
    pg.locator("#rollback").get_by_label(rollback, exact=True).check()
    temperature = pg.get_by_label("number input for temperature (0 = greedy)")
    temperature.fill(str(temp))
    temperature.press("Enter")
    set_number(pg, "max-new", 200)
    step_mode = pg.locator("#step-mode input")
    if not step_mode.is_checked():
        step_mode.check()
    msg = pg.locator("#msg textarea")
    msg.fill(ask)
    msg.press("Enter")
    pg.wait_for_function("() => document.querySelector('#notice').innerText.includes('press Step')")


def kv_caption(pg) -> str:
    pg.locator("button[role=tab]", has_text="KV cache").click()
    text = pg.locator("#kv .kv-caption").inner_text()
    pg.locator("button[role=tab]", has_text="Step mode").click()
    return text


def shoot(pg, name: str, tmp_path: Path) -> None:
    """The step view of one round kind, into docs/ with SPECPLAY_SCREENSHOT_DIR set (docs/ui.md shows them)."""
    folder = Path(os.environ.get(SCREENSHOT_DIR_ENV) or tmp_path)
    folder = folder if folder.is_absolute() else ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    pg.locator("#step").screenshot(path=str(folder / f"step-{name}.png"))


def test_step_mode_tells_every_round_kind_truthfully(browser, server, tmp_path):
    """Stepping through the embedded model's rounds: a chain with a rejection, a tree with pruned branches, a
    checkpoint restore and its replay, a rejection at temperature 0.8, and an empty relay. Each is narrated in the
    lesson's order, and the KV strip names the rollback the engine did (seq_rm only for a range cut)."""
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    pg.set_default_timeout(90_000)
    pg.goto(server, wait_until="domcontentloaded")
    pg.wait_for_selector("#msg textarea")
    pg.locator("button[role=tab]", has_text="Step mode").click()
    copy = f"{QUOTE_ASK}\n\n{QUOTE}"

    start_stepping(pg, "llama.cpp", copy)
    step = walk_to(pg, "s.innerHTML.includes('seq_rm(seq') && s.innerHTML.includes('d1 accepted')", 60)
    assert all(word in step for word in NARRATED) and "<b>Draft.</b>" in step and "Asked in order" in step
    assert "longest agreeing prefix" in step and "seq_rm [" in kv_caption(pg)
    shoot(pg, "chain", tmp_path)

    start_stepping(pg, "playground", OPEN_ASK, tree_nodes=16, n_max=6)  # open text: the head drafts a tree
    step = walk_to(pg, "s.innerText.includes('freed one by one') && /, ([2-9]|\\d\\d) leaves/.test(s.innerText) && "
                       "/from its sampled token: [1-9]/.test(s.innerText)", 60)
    assert all(word in step for word in NARRATED) and "<b>Draft a tree.</b>" in step and "node(s)" in step
    caption = kv_caption(pg)
    assert "branch cell(s) freed one by one" in caption and "seq_rm" not in caption
    shoot(pg, "tree", tmp_path)

    start_stepping(pg, "llama.cpp", copy, rollback="checkpoint", n_max=4)  # short drafts: rejections mid-answer
    step = walk_to(pg, "s.innerHTML.includes('checkpoint restored') && s.innerHTML.includes('d1 accepted') && "
                       "!s.innerText.includes('Finished:')", 60)  # a replay round follows
    assert all(word in step for word in NARRATED) and "state saved before drafting is restored" in step
    caption = kv_caption(pg)
    assert "restore: all" in caption and "seq_rm" not in caption
    shoot(pg, "checkpoint", tmp_path)
    step = walk_to(pg, "true", 1)
    assert "<b>Replay.</b>" in step and "replay wrote the decided tokens back" in kv_caption(pg)

    start_stepping(pg, "llama.cpp", OPEN_ASK, temp=0.8)
    step = walk_to(pg, "s.querySelector('.verify-rows') && s.innerHTML.includes(' rejected;')", 80)
    rows = pg.locator("#step .verify-rows").inner_text()
    assert "min(1, p/q)" in rows and "uniform u" in rows and "rejected" in rows
    assert pg.locator("#step .residual .res-bar").count() >= 1 and "drawn" in pg.locator("#step .residual").inner_text()
    assert "min(1, p(d)/q(d))" in step and "<b>Relay.</b>" in step
    shoot(pg, "temperature", tmp_path)

    start_stepping(pg, "llama.cpp", OPEN_ASK)
    step = walk_to(pg, "s.innerHTML.includes('<b>Plain step.</b>') && s.innerHTML.includes('<b>Relay.</b>')", 60)
    assert "nothing (" in step and "plain decoding step" in step and "(no draft)" in kv_caption(pg)
    shoot(pg, "empty-relay", tmp_path)

    tips = pg.locator("#chat .tok:not(.tok-rej)").evaluate_all("els => els.map(e => e.dataset.tip)")
    assert tips and all("target entropy" in t for t in tips if "pos " in t), tips[:3]
    pg.close()
