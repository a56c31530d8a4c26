"""Browser sessions of the real app over HTTP, for tests/test_load.py and scripts/load_test.py.

Each gradio_client.Client is one browser session: its own session hash, so its own gr.State. A tab that closes
mid-answer is played with plain HTTP requests instead, because a Client cannot drop its event stream and its
heartbeat the way a closing tab does. Outputs are read by searching the views' HTML for the classes and texts
that ui/render.py, ui/run.py and ui/session.py put there; every wait has a deadline.
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

# gradio_client reports each new Client to Hugging Face unless both of these say no (its analytics_enabled
# argument alone cannot turn it off): all traffic here stays on loopback
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

import httpx  # noqa: E402
import pytest  # noqa: E402
from gradio_client import Client  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ui.handlers import VIEWS  # noqa: E402
from ui.settings import Settings  # noqa: E402

FIELDS = list(Settings.__dataclass_fields__)  # the send event's inputs after (message, step mode), in order
CHAT, SUMMARY, NOTICE = VIEWS.index("chat"), VIEWS.index("summary"), VIEWS.index("notice")
POLL_S = 0.05  # how often a session looks at its streamed outputs
STOP_S = 30.0  # bound on a Stop, Step or cancel request, and on a cancelled job ending


# ---- the app process -------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(args: list[str], log: Path) -> subprocess.Popen:
    """python app.py ARGS, its output in `log`; offline, so nothing but the test's requests reaches it."""
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONUNBUFFERED="1")
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "app.py", *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=env)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Until the page answers; RuntimeError with the log's tail if the app exits or stays silent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app.py exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "config", timeout=2):
                return
        except urllib.error.HTTPError as e:
            if e.code == 401:  # a shared app's page asks for its login: it is up
                return
            time.sleep(1)
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"app.py did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def serving(args: list[str], log: Path, timeout: float):
    """The app started with `args` (a port among them) until the caller is done: yields (url, process, log),
    fails the test with the log's tail if it never answers, and always stops it."""
    port = args[args.index("--port") + 1]
    proc = start_app(args, log)
    try:
        url = f"http://127.0.0.1:{port}/"
        try:
            wait_ready(url, proc, log, timeout)
        except RuntimeError as e:
            pytest.fail(str(e))
        yield url, proc, log
    finally:
        stop_app(proc)


def stop_app(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


# ---- the send endpoint -----------------------------------------------------------------------------------

def new_client(url: str) -> Client:
    return Client(url, verbose=False, analytics_enabled=False, download_files=False)


@dataclass
class Api:
    url: str
    defaults: list  # what a new page's sidebar holds, in Settings field order
    fn: dict  # api name -> fn_index, for the raw requests of a closing tab


def connect(url: str) -> Api:
    """The send endpoint's defaults from view_api(); fails if its inputs no longer match the Settings fields."""
    client = new_client(url)
    try:
        params = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/send"]["parameters"]
        fn = {d.get("api_name"): d["id"] for d in client.config["dependencies"]}
    finally:
        client.close()
    if len(params) != 2 + len(FIELDS):
        raise RuntimeError(f"/send takes {len(params)} inputs, expected message, step mode and {FIELDS}")
    return Api(url=url, defaults=[p["parameter_default"] for p in params[2:]], fn=fn)


def send_args(api: Api, text: str, stepping: bool = False, **settings) -> list:
    """[message, step mode, *sidebar]: the page's defaults with `settings` (Settings field names) changed."""
    values = dict(zip(FIELDS, api.defaults))
    for name, value in settings.items():
        if name not in values:
            raise KeyError(f"no sidebar control {name!r}; known: {FIELDS}")
        values[name] = value
    return [text, stepping] + [values[name] for name in FIELDS]


# ---- reading the views -----------------------------------------------------------------------------------

def view(out, index: int) -> str:
    """One view of an output tuple; a view the handler left unchanged arrives as an update dict."""
    value = out[index] if out is not None and len(out) > index else ""
    return value if isinstance(value, str) else ""


def has_tokens(chat: str) -> bool:
    return 'class="tok ' in chat


def n_tokens(summary: str) -> int:
    m = re.search(r"speculative</span>\s*(\d+) tokens", summary)
    return int(m.group(1)) if m else 0


def stop_reason(summary: str) -> str:
    m = re.search(r"stop: ([^<·]+)", summary)
    return m.group(1).strip() if m else ""


def speedup(summary: str) -> float | None:
    m = re.search(r'class="speedup [\w-]+">([\d.]+)&times;', summary)
    return float(m.group(1)) if m else None


def under_load(summary: str) -> bool:
    return 'class="cmp-load"' in summary


def lossless(summary: str) -> bool:
    return "lossless-ok" in summary


def expected_diff(summary: str) -> bool:
    """Speculative and plain differ, and the page says why that is right (rejection sampling, temperature > 0)."""
    return "lossless-diff" in summary and "expected with rejection sampling" in summary


def started_nothing(chat: str, summary: str) -> bool:
    """No answer in the chat and no run in the summary: the request was refused before the engine saw it."""
    return "chat-empty" in chat and "summary muted" in summary


# ---- sessions --------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    role: str  # regular | cancel | close-tab | stop | step | follow-up | bad | fresh
    prompt: str
    temp: float = 0.0
    finished: bool = False  # its last output arrived (or, cancelled, it ended)
    hung: bool = False  # no end within its bound
    error: str = ""  # an exception, or Gradio's refusal
    ttft: float | None = None  # seconds from submit to the first answer token on the page
    seconds: float = 0.0  # submit to the last output
    waited: bool = False  # the page said "in line" before the answer began: it queued for a slot
    waited_again: bool = False  # ... after it began: the comparison's plain run queued for a slot
    lines: tuple = ()  # every distinct "in line" notice the page showed
    chat: str = ""
    summary: str = ""  # the last summary view: speed line, stop reason, comparison
    notice: str = ""  # the last notice view

    @property
    def tokens(self) -> int:
        return n_tokens(self.summary)

    @property
    def answered(self) -> bool:
        """A full answer and its comparison; at temperature 0 identical to plain decoding."""
        compared = lossless(self.summary) or (self.temp > 0 and expected_diff(self.summary))
        return (self.finished and not self.hung and not self.error and compared
                and stop_reason(self.summary) in ("length", "eos"))


def wait_barrier(start: threading.Barrier | None) -> None:
    """All sessions submit together; a broken barrier (another session failed early) does not hold this one."""
    if start is not None:
        try:
            start.wait(timeout=120)
        except threading.BrokenBarrierError:
            pass


def note(o: Outcome, out, t0: float) -> None:
    if o.ttft is None and has_tokens(view(out, CHAT)):
        o.ttft = time.monotonic() - t0
    notice = view(out, NOTICE)
    if "in line" in notice:
        if o.ttft is None:
            o.waited = True
        else:
            o.waited_again = True
        if notice not in o.lines:
            o.lines += (notice,)


def keep_last(o: Outcome, out) -> None:
    o.chat, o.summary, o.notice = view(out, CHAT), view(out, SUMMARY), view(out, NOTICE)


def watch(job, o: Outcome, t0: float, deadline: float, until_tokens: bool = False) -> None:
    """Follow a streaming job until it ends (or, with until_tokens, until its answer has begun) or the deadline
    passes; notes the first token, any place in line and the last views."""
    seen = 0
    while True:
        done = job.done()  # before reading the outputs, so that the last one is read once it is done
        outs = job.outputs()
        for out in outs[seen:]:
            note(o, out, t0)
            keep_last(o, out)
        seen = len(outs)
        if done or (until_tokens and o.ttft is not None):
            break
        if time.monotonic() > deadline:
            o.hung = True
            return
        time.sleep(POLL_S)
    if job.done():
        try:
            job.result(timeout=0)
            o.finished = True
        except Exception as e:  # Gradio refused the input or the handler raised: the message is the finding
            o.error = f"{type(e).__name__}: {e}"
        o.seconds = time.monotonic() - t0


def chat_turn(client: Client, api: Api, o: Outcome, timeout: float, **settings) -> None:
    """One chat turn followed to its end: the answer, then the comparison with plain decoding."""
    t0 = time.monotonic()
    job = client.submit(*send_args(api, o.prompt, temp=o.temp, **settings), api_name="/send")
    watch(job, o, t0, t0 + timeout)
    if o.hung:
        job.cancel()


def run_regular(api: Api, prompt: str, temp: float, max_new: int, timeout: float,
                start: threading.Barrier | None = None, role: str = "regular", client: Client | None = None) -> Outcome:
    """A chat turn read to its end; on `client` when given (connected beforehand), else on a new one."""
    o = Outcome(role, prompt, temp)
    client = client or new_client(api.url)
    try:
        wait_barrier(start)
        chat_turn(client, api, o, timeout, max_new_tokens=max_new)
    except Exception as e:
        o.error = o.error or f"{type(e).__name__}: {e}"
    finally:
        client.close()
    return o


def run_cancel(api: Api, prompt: str, temp: float, max_new: int, timeout: float,
               start: threading.Barrier | None = None) -> Outcome:
    """The client cancels its job once the answer streams (Gradio closes the handler: converse's finally
    frees the slot), then leaves."""
    o = Outcome("cancel", prompt, temp)
    client = new_client(api.url)
    try:
        wait_barrier(start)
        t0 = time.monotonic()
        job = client.submit(*send_args(api, prompt, temp=temp, max_new_tokens=max_new), api_name="/send")
        watch(job, o, t0, t0 + timeout, until_tokens=True)
        job.cancel()
        end = time.monotonic() + STOP_S
        while not job.done() and time.monotonic() < end:
            time.sleep(POLL_S)
        o.finished, o.hung = job.done(), o.hung or not job.done()
        o.seconds = time.monotonic() - t0
    except Exception as e:
        o.error = f"{type(e).__name__}: {e}"
    finally:
        client.close()
    return o


def join(http: httpx.Client, base: str, fn_index: int, data: list, session: str) -> None:
    r = http.post(base + "queue/join", json={"data": data, "fn_index": fn_index, "session_hash": session,
                                             "event_data": None, "trigger_id": None})
    r.raise_for_status()


def read_until(http: httpx.Client, base: str, session: str, marker: str, deadline: float) -> bool:
    """Read the session's event stream until a line holds `marker`; False if it ends or the deadline passes."""
    with http.stream("GET", base + "queue/data", params={"session_hash": session}) as stream:
        for line in stream.iter_lines():
            if marker in line:
                return True
            if time.monotonic() > deadline:
                return False
    return False


def run_close_tab(api: Api, prompt: str, temp: float, max_new: int, timeout: float,
                  start: threading.Barrier | None = None) -> Outcome:
    """A browser tab: it holds a heartbeat, loads the page (on_open registers the session so a close can free
    its slot), sends, and is closed once the answer streams: both connections drop, as when a tab closes."""
    o = Outcome("close-tab", prompt, temp)
    session, base = str(uuid.uuid4()), api.url + "gradio_api/"
    # the read timeout bounds a silent stream; the heartbeat sends a line every 15 s
    try:
        with httpx.Client(timeout=httpx.Timeout(10.0, read=min(timeout, 60.0))) as http:
            with http.stream("GET", base + f"heartbeat/{session}"):
                join(http, base, api.fn["on_open"], [None], session)
                read_until(http, base, session, '"process_completed"', time.monotonic() + STOP_S)
                wait_barrier(start)
                t0 = time.monotonic()
                join(http, base, api.fn["send"], [None] + send_args(api, prompt, temp=temp, max_new_tokens=max_new),
                     session)
                o.finished = read_until(http, base, session, 'class=\\"tok ', t0 + timeout)
                o.hung = not o.finished
                o.ttft = o.seconds = time.monotonic() - t0
    except httpx.HTTPError as e:
        o.error = f"{type(e).__name__}: {e}"
    return o


def with_follow_up(api: Api, kind: str, prompt: str, timeout: float, start: threading.Barrier | None,
                   turn) -> list[Outcome]:
    """One session: `turn(client, outcome, t0)` plays the first turn and says whether to ask again; then the
    same session asks again and must be served."""
    o = Outcome(kind, prompt, 0.0)
    after = Outcome("follow-up", prompt, 0.0)
    client = new_client(api.url)
    try:
        wait_barrier(start)
        if turn(client, o, time.monotonic()):
            chat_turn(client, api, after, timeout, max_new_tokens=24)
    except Exception as e:
        o.error = o.error or f"{type(e).__name__}: {e}"
    finally:
        client.close()
    return [o, after]


def run_stop(api: Api, prompt: str, max_new: int, timeout: float,
             start: threading.Barrier | None = None, **settings) -> list[Outcome]:
    """Stop pressed once the answer streams; then the same session asks again and must be served."""
    def turn(client, o: Outcome, t0: float) -> bool:
        job = client.submit(*send_args(api, prompt, **{"temp": 0.0, "max_new_tokens": max_new, **settings}),
                            api_name="/send")
        watch(job, o, t0, t0 + timeout, until_tokens=True)
        if not o.hung:
            client.submit(api_name="/stop").result(timeout=STOP_S)
            watch(job, o, t0, time.monotonic() + STOP_S)
        return o.finished

    return with_follow_up(api, "stop", prompt, timeout, start, turn)


def run_step(api: Api, prompt: str, steps: int, timeout: float,
             start: threading.Barrier | None = None) -> list[Outcome]:
    """Step mode: send, a few Steps (more while it waits in line for a slot), Stop; then a normal turn."""
    def turn(client, o: Outcome, t0: float) -> bool:
        out = client.submit(*send_args(api, prompt, stepping=True, temp=0.0), api_name="/send").result(timeout=STOP_S)
        keep_last(o, out)
        for i in range(steps + 200):  # the extra Steps only while no round has run yet (waiting for a slot)
            if i >= steps and has_tokens(o.chat) or time.monotonic() > t0 + timeout:
                break
            out = client.submit(api_name="/step").result(timeout=STOP_S)
            note(o, out, t0)
            keep_last(o, out)
            if i >= steps:
                time.sleep(0.2)
        keep_last(o, client.submit(api_name="/stop").result(timeout=STOP_S))
        o.finished = "stop: stopped" in o.summary
        o.hung = not o.finished
        o.seconds = time.monotonic() - t0
        return True

    return with_follow_up(api, "step", prompt, timeout, start, turn)


def run_bad(api: Api, label: str, text: str, timeout: float, start: threading.Barrier | None = None,
            **settings) -> Outcome:
    """One refused request in its own session: the notice (or Gradio's error) is kept for the caller to check."""
    o = Outcome("bad", label)
    client = new_client(api.url)
    try:
        wait_barrier(start)
        t0 = time.monotonic()
        job = client.submit(*send_args(api, text, **settings), api_name="/send")
        watch(job, o, t0, t0 + timeout)
    except Exception as e:
        o.error = f"{type(e).__name__}: {e}"
    finally:
        client.close()
    return o


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
