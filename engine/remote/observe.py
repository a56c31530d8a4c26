"""A server seen from outside: what it says it runs, and one answer watched between two scrapes of its /metrics.

Every OpenAI-compatible server lists its model at `/v1/models`, and its `owned_by` names the server (llama-server:
"llamacpp", vLLM: "vllm", SGLang: "sglang", this playground: "spec-playground"). llama-server states its
speculation in `/props` (the `speculative.*` parameters of its default generation settings), SGLang in
`/get_server_info` (`speculative_*`); vLLM states none over HTTP.

The counters' change over an answer is that answer's speculation only when nobody else was served meanwhile: the
tokens the server gave out between the two scrapes must be the answer's own. Otherwise the change is the server's,
not the answer's (`Observation.alone` False).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from engine.remote.client import RemoteAnswer, RemoteClient
from engine.remote.counters import SpecDelta, delta, read_counts

OWNERS = {"llamacpp": "llama-server", "vllm": "vllm", "sglang": "sglang", "spec-playground": "playground"}
# body fields that turn speculation off for one request, where the server takes them: llama-server drafts only
# while its request's speculative.n_max is above 0 (builds whose server-schema.cpp leaves the speculative.*
# fields out ignore it; plain_answer sees that in the answer's timings); this playground takes "speculative": false
PLAIN_REQUEST = {"llama-server": {"speculative.n_max": 0}, "playground": {"speculative": False}}


@dataclass(frozen=True)
class ServerInfo:
    """A server as it describes itself."""

    kind: str  # "llama-server", "vllm", "sglang", "playground", or "openai-compatible" when it does not say
    model: str | None  # the model it serves (the first listed)
    speculative: dict = field(default_factory=dict)  # its stated speculation settings by its own names
    build: str | None = None  # its build or version string, where it gives one

    @property
    def plain_request(self) -> dict | None:
        """Body fields asking this server for one answer without speculation; None where it takes none (vLLM,
        SGLang: compare with a second server started without speculation instead)."""
        return PLAIN_REQUEST.get(self.kind)

    def describe(self) -> str:
        spec = ", ".join(f"{k} {v}" for k, v in self.speculative.items()) or "speculation settings not stated"
        return f"{self.kind} serving {self.model or 'an unnamed model'} ({spec})"


def read_server_info(client: RemoteClient) -> ServerInfo:
    """Ask the server; raises engine.remote.client.RemoteError when it cannot be reached."""
    models = client.get_json("/v1/models") or {}
    listed = [m for m in models.get("data") or [] if isinstance(m, dict)]
    first = listed[0] if listed else {}
    kind = OWNERS.get(str(first.get("owned_by", "")).lower(), "openai-compatible")
    props = client.get_json("/props") if kind in ("llama-server", "openai-compatible") else None
    if props is not None and "default_generation_settings" in props:
        kind = "llama-server"
        return ServerInfo(kind, first.get("id") or props.get("model_path"), _llama_speculative(props),
                          props.get("build_info"))
    if kind == "sglang":
        info = client.get_json("/get_server_info") or {}
        spec = {k: v for k, v in info.items() if k.startswith("speculative_") and v is not None}
        return ServerInfo(kind, first.get("id"), spec, info.get("version"))
    return ServerInfo(kind, first.get("id"))


def _llama_speculative(props: dict) -> dict:
    """llama-server's speculative.* settings: under default_generation_settings.params (older builds: directly
    under default_generation_settings)."""
    settings = props.get("default_generation_settings") or {}
    params = settings.get("params") if isinstance(settings.get("params"), dict) else settings
    return {k: v for k, v in params.items() if k.startswith("speculative.")}


# the rounds stay inside the server: what a page of this playground shows of its own answers and cannot here
NOT_SHOWN = ("which tokens each round drafted and which the target rejected, the drafter of each round, where "
             "the rejected tail sat in the cache, and each round's time: the server keeps its rounds to itself")


@dataclass
class Observation:
    """An answer and what the server's counters say about it."""

    answer: RemoteAnswer
    spec: SpecDelta | None  # the counters' change over the answer; None where the server publishes none
    alone: bool | None  # True: the change is this answer's alone; False: others were served too; None: unknown
    note: str = ""  # why spec is None or not this answer's alone

    @property
    def drafted(self) -> float | None:
        """Draft tokens: the server's own count for this answer (timings) where it gives one, else the counters'."""
        if self.answer.draft_n is not None:
            return self.answer.draft_n
        return self.spec.draft_tokens if self.spec is not None and self.alone else None

    @property
    def accepted(self) -> float | None:
        if self.answer.draft_n_accepted is not None:
            return self.answer.draft_n_accepted
        return self.spec.accepted if self.spec is not None and self.alone else None


def observe(client: RemoteClient, body: dict) -> Iterator[str]:
    """Stream one answer between two scrapes of /metrics: yields its text and returns the Observation."""
    before = _counts(client)
    answer = yield from client.stream_chat(body)
    after = _counts(client)
    return judge(answer, before, after)


def observe_whole(client: RemoteClient, body: dict) -> Observation:
    stream = observe(client, body)
    while True:
        try:
            next(stream)
        except StopIteration as done:
            return done.value


def judge(answer: RemoteAnswer, before, after) -> Observation:
    """The Observation of an answer from the counters scraped around it."""
    if before is None or after is None:
        return Observation(answer, None, None, "the server publishes no speculation counters at /metrics "
                                               "(llama-server: start it with --metrics and a draft)")
    spec = delta(before, after)
    if spec is None:
        return Observation(answer, None, None, "the counters went down between the scrapes: the server restarted")
    n = answer.completion_tokens
    if spec.generated is None or n is None:
        return Observation(answer, spec, None, "the server does not say how many tokens it gave out meanwhile: "
                                               "others' answers may be counted too")
    alone = abs(spec.generated - n) <= 1  # some servers count the last token, or the first, apart
    note = "" if alone else (f"the server gave out {spec.generated:.0f} tokens meanwhile, this answer {n}: "
                             "the change counts others' answers too")
    return Observation(answer, spec, alone, note)


def _counts(client: RemoteClient):
    text = client.metrics_text()
    return read_counts(text) if text is not None else None


def plain_answer(client: RemoteClient, body: dict, info: ServerInfo,
                 twin: RemoteClient | None = None) -> tuple[RemoteAnswer | None, str]:
    """(the same request answered without speculation, "") from `twin` (the same model served without it) or
    through the server's per-request switch; (None, why) where neither gives one or the server drafted anyway."""
    if twin is not None:
        return twin.chat(body), ""
    if info.plain_request is None:
        return None, f"no plain run: {info.kind} takes no per-request switch; name a twin served without speculation"
    plain = client.chat({**body, **info.plain_request})
    if plain.draft_n:
        return None, (f"no plain run: the server drafted {plain.draft_n} tokens when asked not to (this build "
                      "ignores per-request speculative fields); name a twin served without speculation")
    return plain, ""
