"""The flags that guard a playground others can reach, their defaults and refusals, and the front door they
build (docs/ui.md, Sharing safely).

An app is local only when it listens on a loopback address, makes no public link and answers to no other host
name: a `--allowed-host` on loopback is the reverse-proxy set-up, reachable from elsewhere, and is guarded as
such (a key, no model loading by visitors unless allowed). Keys come from `SPECPLAY_API_KEY`, `--api-key-file`
or `--api-key`; they are never printed.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path

KEY_MIN_CHARS = 16  # a key shorter than this is refused unless --weak-key: the page's sign-in is guessable


def add_sharing_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="API key clients send as 'Authorization: Bearer KEY' for /v1/* and /metrics; repeat it to "
                        "give several clients a key each. Prefer SPECPLAY_API_KEY (comma-separated) or "
                        "--api-key-file: a command line shows in `ps`. Required when the app is reachable from "
                        "other hosts, where the page then asks for it too (any user name)")
    p.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="a file of API keys, one a line (blank lines and lines starting with # skipped)")
    p.add_argument("--weak-key", action="store_true",
                   help=f"accept keys shorter than {KEY_MIN_CHARS} characters")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a host name the app answers to besides its addresses and localhost (a DNS name pointing "
                        "here, a proxy's); '.example.org' allows its subdomains, '*' any name (no DNS-rebinding "
                        "protection). With it the app counts as reachable from other hosts, on loopback too")
    p.add_argument("--allowed-origin", action="append", default=[], metavar="URL",
                   help="a page origin (scheme://host:port, compared exactly) that may call the app besides the "
                        "app's own pages; --share trusts its own link only")
    p.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDR",
                   help="a reverse proxy's address (or network, 10.0.0.0/8) whose X-Forwarded-For names the "
                        "visitor; from no other address is that header believed")
    p.add_argument("--ctx-per-slot", type=int, default=None, metavar="N",
                   help="cells one answer may hold, prompt included (default: --n-ctx / --parallel, as "
                        "llama-server divides its context); 0: the whole cache, so one long request can cut the "
                        "others' answers short")
    p.add_argument("--share-prefix-cache", action="store_true",
                   help="reuse a cached prompt prefix (and compiled grammars) across page tabs and API clients (a "
                        "shared system prompt prefilled once); off by default: a visitor could then infer "
                        "another's prompt from timings.cache_n or the prefill's time")
    p.add_argument("--client-max", type=int, default=None, metavar="N",
                   help="requests one visitor (its key and address, or its address without keys) may have running "
                        "or waiting at once, page tabs and API together; past it 429 or a wait on the page "
                        "(default: half the slots, at least 1)")
    p.add_argument("--exempt-loopback", action="store_true",
                   help="do not count the operator's own loopback tabs and scripts against --client-max and "
                        "--max-streams (a local-only app only)")
    p.add_argument("--max-connections", type=int, default=1000, metavar="N",
                   help="requests open at once in all (streams included); past it 503 (default 1000)")
    p.add_argument("--max-streams", type=int, default=64, metavar="N",
                   help="requests one visitor may hold open at once: tabs' heartbeats, event streams, streamed "
                        "answers; past it 429 (default 64)")
    p.add_argument("--model-dir", action="append", default=[], metavar="DIR",
                   help="a folder whose models (directories with a config.json, .gguf files) visitors may load "
                        "from the page by name; paths elsewhere are refused")
    p.add_argument("--allow-hub-models", action="store_true",
                   help="let visitors load HF hub ids from the page (they download into the cache)")
    p.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES",
                   help="largest request body taken (default 1 MiB); larger ones get 413 before being read")
    p.add_argument("--max-upload", type=int, default=10 << 20, metavar="BYTES",
                   help="largest file the page takes as an upload (default 10 MiB)")


def settle_sharing_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Defaults that depend on other flags, the bounds, and the refusals to start."""
    try:
        args.api_key = gather_keys(args.api_key, args.api_key_file)
    except OSError as e:
        p.error(f"--api-key-file: cannot read it: {e.strerror}")
    if args.ctx_per_slot is None:
        args.ctx_per_slot = args.n_ctx // args.parallel
    if args.ctx_per_slot < 0 or (args.client_max or 1) < 1 or args.max_body < 1 or args.max_upload < 1 \
            or args.max_connections < 1 or args.max_streams < 1:
        p.error("--ctx-per-slot must be >= 0, --client-max, --max-body, --max-upload, --max-connections and "
                "--max-streams >= 1")
    if args.client_max is None:
        args.client_max = max(1, args.parallel // 2)
    weak = [k for k in args.api_key if len(k) < KEY_MIN_CHARS]
    if weak and not args.weak_key:
        p.error(f"{len(weak)} API key(s) hold fewer than {KEY_MIN_CHARS} characters: anyone may guess them. Use "
                "longer keys (python -c 'import secrets; print(secrets.token_urlsafe(24))') or --weak-key")
    if args.exempt_loopback and not local_only(args):
        p.error("--exempt-loopback is for a local-only app: behind a proxy or a --share link every visitor "
                "arrives from loopback")
    reason = unsafe_reason(args)
    if reason:
        p.error(reason)


def gather_keys(given: list[str] | None, key_file: str | None) -> list[str]:
    """Keys from the command line, else SPECPLAY_API_KEY, plus a key file's; each stripped, blanks dropped."""
    keys = [k.strip() for k in (given or keys_from_environment())]
    if key_file:
        lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        keys += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return list(dict.fromkeys(k for k in keys if k))


def keys_from_environment() -> list[str]:
    return [k.strip() for k in os.environ.get("SPECPLAY_API_KEY", "").split(",") if k.strip()]


def unsafe_reason(args: argparse.Namespace) -> str | None:
    """Why the app must not start as asked: reachable from other hosts with no key anyone must know."""
    if args.api_key or local_only(args):
        return None
    where = ("a public --share link" if args.share else f"--host {args.host} with --allowed-host (a proxy's "
             "name: reachable from other hosts)" if is_loopback(args.host) else
             f"--host {args.host} (reachable from other hosts)")
    return (f"refusing to serve {where} without an API key: anyone reaching the port could run the engine and "
            "read /metrics. Set SPECPLAY_API_KEY (or --api-key-file); the page then asks for it as its password")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def local_only(args: argparse.Namespace) -> bool:
    """Only this machine reaches the app: a loopback address, no public link, no other host name to answer."""
    return is_loopback(args.host) and not args.share and not args.allowed_host


def model_load_allowed(args: argparse.Namespace) -> bool:
    """Visitors may load models when only this machine reaches the page, or when the host says so."""
    return args.allow_model_load or local_only(args)


def trust_forwarded(proxies: list[str]) -> None:
    """Uvicorn believes X-Forwarded-For from FORWARDED_ALLOW_IPS (127.0.0.1 unless set): only the named proxies
    now, so a local client cannot pose as any address. Set before launch; uvicorn reads it then."""
    os.environ["FORWARDED_ALLOW_IPS"] = ",".join(proxies) if proxies else "0.0.0.0/32"


def front_door(args: argparse.Namespace, state) -> tuple[dict, object]:
    """launch() options that guard the app (the middleware on every request, the API's routes, the page's login
    when it is reachable from other hosts: any user name, a key as the password), and the GuardConfig, whose
    share link is added once launch() has made it (`trust_share_link`)."""
    from starlette.middleware import Middleware

    from ui.api.guard import Guard, GuardConfig, page_visitor
    from ui.api.openings import Openings
    from ui.visitors import ClientLimits

    login = bool(args.api_key) and not local_only(args)
    config = GuardConfig(keys=tuple(args.api_key), allowed_hosts=tuple(a.lower() for a in args.allowed_host),
                         allowed_origins=tuple(args.allowed_origin), body_max=args.max_body,
                         upload_max=args.max_upload, page_login=login)
    openings = Openings(total_max=args.max_connections, each_max=args.max_streams,
                        exempt_loopback=args.exempt_loopback)
    state.limits = ClientLimits(max_each=args.client_max, exempt_loopback=args.exempt_loopback)
    state.identify = lambda request: page_visitor(config, request)
    trust_forwarded(args.trusted_proxy)
    kwargs: dict = {"middleware": [Middleware(Guard, config=config, openings=openings)]}
    if not args.no_api:
        from ui.api.routes import api_routes

        # the routes join the FastAPI app Gradio builds (FastAPI(routes=...), ahead of Gradio's own), so the
        # API shares the page's host, port and --share link
        kwargs["routes"] = api_routes(state, keyed=bool(args.api_key))
    options: dict = {"app_kwargs": kwargs, "mcp_server": False}
    if login:
        options["auth"] = lambda user, password: config.valid_key(password) and config.logins.bind(user.strip(),
                                                                                                     password)
        options["auth_message"] = ("This playground is shared: sign in with a name of your choice and the key its "
                                   "host gave you (a name stays with the key it first signed in with).")
    return options, config


def trust_share_link(config, share_url: str | None) -> None:
    """The --share link launch() made: its host may be named and its pages may call the app, no other link's."""
    if not share_url:
        return
    from urllib.parse import urlsplit

    parts = urlsplit(share_url)
    if parts.hostname:
        config.late_hosts.append(parts.hostname.lower())
        config.late_origins.append(f"{parts.scheme}://{parts.netloc}")
