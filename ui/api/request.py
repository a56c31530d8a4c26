"""An OpenAI chat-completions request body, checked and turned into what the page would submit.

The fields are OpenAI's (messages, temperature, top_p, seed, max_tokens / max_completion_tokens, stop,
response_format, stream) and a few of llama-server's (top_k, min_p, ignore_eos, speculative.n_max / n_min /
p_min). `speculative: false` is this app's own: plain decoding with the same sampler, for a lossless check from
outside. Everything else goes through ui/settings.Settings, the page's own path to GenParams, so an API answer
is built exactly as a page answer with the same controls. Bad input raises ApiError, a 400 with OpenAI's body
naming the field; `parse_body` reads the bytes as strict JSON (no NaN or Infinity, bounded nesting).
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field

from engine import GenParams
from ui.settings import Settings

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# OpenAI's fields this app cannot honour: refused rather than ignored, so a client never gets less than it asked
UNSUPPORTED = ("tools", "functions", "logit_bias", "logprobs", "top_logprobs", "audio", "prediction")
SEED_LIMIT = 2 ** 63  # engine.sampling.SamplerParams takes seeds in [0, 2^63)

MAX_STOPS = 4  # stop strings a request may give (OpenAI's limit)
MAX_STOP_CHARS = 256  # characters a stop string may hold
INT_LIMIT = 2 ** 31  # integer fields (max_tokens, top_k, n_max, ...) beyond this are refused, not clipped
MAX_DEPTH = 32  # nesting a body may have: a chat request needs 5 levels (a json_schema more)
MAX_SALT_CHARS = 256  # characters a cache_salt may hold


class ApiError(Exception):
    """An answer other than 200, with OpenAI's error body: 400 invalid_request_error unless told otherwise."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error",
                 param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}}


@dataclass
class ChatRequest:
    messages: list[dict]  # role and text content, as LoadedModel.encode_chat takes them
    settings: Settings  # the page's controls this request amounts to (types: the page's default chain)
    stream: bool = False
    stop: list[str] = field(default_factory=list)  # the answer ends before the first of these
    max_tokens: int | None = None  # None: until end-of-sequence or the context is full, as llama-server
    speculative: bool = True
    ignore_eos: bool = False
    cache_salt: str = ""  # the client's own cache_salt (vLLM's field), joined to its identity by the routes

    def gen_params(self, room: int) -> GenParams:
        """GenParams through Settings.gen_params; `room`: the tokens the context has left after the prompt,
        the limit when the request sets none. Raises ApiError with the engine's own message."""
        self.settings.max_new_tokens = self.max_tokens if self.max_tokens is not None else max(1, room)
        try:
            params = self.settings.gen_params(speculative=self.speculative)
            params.ignore_eos = self.ignore_eos
            params.validate()
        except ValueError as e:
            raise ApiError(str(e), param=param_named(str(e))) from e
        return params


# the engine's parameter a validation message begins with -> the request's field that sets it
ENGINE_FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                 "seed": "seed", "max_new_tokens": "max_tokens", "n_max": "speculative.n_max",
                 "n_min": "speculative.n_min", "p_min": "speculative.p_min", "a grammar": "response_format"}


def param_named(message: str) -> str | None:
    """The request's field an engine validation message is about (GenParams.validate names it first)."""
    for word, param in ENGINE_FIELDS.items():
        if message.startswith(word):
            return param
    return None


def reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def depth(value, limit: int) -> int:
    """How deeply `value` nests lists and objects, counted up to limit + 1 (iteratively: no recursion)."""
    deepest, todo = 0, [(value, 1)]
    while todo and deepest <= limit:
        item, level = todo.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, level)
            todo.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_body(raw: bytes):
    """A request body as strict JSON. Raises ApiError: not UTF-8 JSON, NaN / Infinity, nesting past MAX_DEPTH."""
    try:
        body = json.loads(raw, parse_constant=reject_constant)
    except RecursionError:
        raise ApiError(f"the request body nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise ApiError(f"the request body is not JSON: {str(e)[:200]}") from None
    if depth(body, MAX_DEPTH) > MAX_DEPTH:
        raise ApiError(f"the request body nests deeper than {MAX_DEPTH} levels")
    return body


def number(body: dict, key: str, default, kind: type = float, limit: int = INT_LIMIT):
    """body[key] as `kind` (int accepts whole numbers only, of magnitude below `limit`); absent or null gives
    `default`."""
    value = body.get(key)
    if value is None:
        return default
    what = "an integer" if kind is int else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(f"{key} must be {what}, got {value!r}"[:300], param=key)
    if kind is int and (value != int(value) or abs(value) >= limit):
        raise ApiError(f"{key} must be an integer of magnitude below {limit}, got {value!r}"[:300], param=key)
    return kind(value)


def text_of(content, where: str) -> str:
    """A message's content: a string, or OpenAI's list of parts of which only text ones are understood."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(f"{where}: only text content parts are supported, got {kind!r}", param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(f"{where}: content must be a string or a list of text parts", param="messages")


def messages_of(raw, max_chars: int | None = None) -> list[dict]:
    """The messages; their text may hold at most max_chars characters in all (None: no bound), checked before
    any template or tokenizer reads it."""
    if not isinstance(raw, list) or not raw:
        raise ApiError("messages must be a non-empty list of {role, content} objects", param="messages")
    out, n_chars = [], 0
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, dict) else None
        if not isinstance(role, str) or role not in ROLES:
            raise ApiError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}"[:300], param="messages")
        out.append({"role": ROLES[role], "content": text_of(m.get("content"), where)})
        n_chars += len(out[-1]["content"])
        if max_chars is not None and n_chars > max_chars:
            raise ApiError(f"the messages hold over {max_chars} characters: that does not fit the model's context, "
                           "whatever the tokenizer makes of them", param="messages")
    return out


def stop_of(raw) -> list[str]:
    if raw is None:
        return []
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError("stop must be a string or a list of strings", param="stop")
    # OpenAI's bounds: every round's text is checked against each stop, so their number and size stay small
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise ApiError(f"at most {MAX_STOPS} stop strings of at most {MAX_STOP_CHARS} characters", param="stop")
    return [s for s in stops if s]


def format_of(raw) -> tuple[str, str]:
    """response_format -> (Settings.output_format, Settings.format_text): the page's JSON modes."""
    if raw is None:
        return "free", ""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind == "text":
        return "free", ""
    if kind == "json_object":  # llama-server also takes a schema here
        schema = raw.get("schema")
        return ("json", "") if schema is None else ("json_schema", json.dumps(schema))
    if kind == "json_schema":
        inner = raw.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else raw.get("schema")
        if not isinstance(schema, (dict, bool)):
            raise ApiError("response_format json_schema needs json_schema.schema, a JSON schema object",
                           param="response_format")
        return "json_schema", json.dumps(schema)
    raise ApiError(f"response_format type must be text, json_object or json_schema, got {kind!r}",
                   param="response_format")


def refuse_unsupported(body: dict) -> None:
    for key in UNSUPPORTED:
        if body.get(key) not in (None, False, [], {}):
            raise ApiError(f"{key} is not supported by this server", param=key)
    if number(body, "n", 1, int) != 1:
        raise ApiError("n must be 1: one answer per request", param="n")
    for key in ("presence_penalty", "frequency_penalty"):
        if number(body, key, 0.0) != 0.0:
            raise ApiError(f"{key} is not supported by this server (only 0)", param=key)


def max_tokens_of(body: dict) -> int | None:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = number(body, key, None, int)
    if value is not None and value < 1:
        raise ApiError(f"{key} must be >= 1, got {value}", param=key)
    return value


def salt_of(raw) -> str:
    """vLLM's cache_salt: a client's own further partition of the prefix cache ("" none)."""
    if raw is None:
        return ""
    if not isinstance(raw, str) or len(raw) > MAX_SALT_CHARS:
        raise ApiError(f"cache_salt must be a string of at most {MAX_SALT_CHARS} characters", param="cache_salt")
    return raw


def parse_chat(body, chain: list[str], max_chars: int | None = None, tree_nodes: int | None = None) -> ChatRequest:
    """Check a request body and build its ChatRequest; `chain` and `tree_nodes`: the page's default drafter chain
    and tree nodes (None: Settings'); max_chars: the most characters the messages may hold (ui/api/routes.py: the
    context's tokens times the longest token)."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    refuse_unsupported(body)
    seed = number(body, "seed", None, int, SEED_LIMIT)
    output_format, format_text = format_of(body.get("response_format"))
    d = Settings()
    settings = Settings(
        types=list(chain), temp=number(body, "temperature", 1.0), top_p=number(body, "top_p", 1.0),
        top_k=number(body, "top_k", 0, int), min_p=number(body, "min_p", 0.0),
        # no seed: a fresh one, as OpenAI and llama-server draw one per request
        seed=secrets.randbelow(SEED_LIMIT) if seed is None else seed,
        n_max=number(body, "speculative.n_max", d.n_max, int), n_min=number(body, "speculative.n_min", d.n_min, int),
        p_min=number(body, "speculative.p_min", d.p_min), p_min_own=body.get("speculative.p_min") is None,
        compare=False, output_format=output_format, format_text=format_text,
        tree_nodes=d.tree_nodes if tree_nodes is None else tree_nodes)
    flags = {key: body.get(key, default) for key, default in (("stream", False), ("speculative", True),
                                                                ("ignore_eos", False))}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise ApiError(f"{key} must be true or false, got {value!r}", param=key)
    return ChatRequest(messages=messages_of(body.get("messages"), max_chars), settings=settings,
                       stop=stop_of(body.get("stop")), max_tokens=max_tokens_of(body),
                       cache_salt=salt_of(body.get("cache_salt")), **flags)
