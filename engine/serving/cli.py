"""``python -m engine.serve``: the command line of the OpenAI-compatible server.

The API key comes from ``--api-key-file PATH`` or the ``HEARTH_API_KEY`` environment variable, which ``ps`` does
not show; ``--api-key KEY`` still works for a quick test.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.api import LEVEL_LABELS, QUANTIZATION_LEVELS, SPECULATIVE_METHODS, ModelLoadError
from engine.serving.async_engine import AsyncLLMEngine
from engine.serving.guards import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_REQUESTS_PER_CLIENT,
    GuardRules,
    is_loopback,
)
from engine.serving.openai_app import DEFAULT_REQUEST_TIMEOUT_S, create_app, uvicorn_server
from engine.serving.transport import ConnectionLimits, bind_socket
from engine.system.hardware import THREADS_ENV, configure_threads, requested_threads

#: The environment variable holding the API key.
API_KEY_ENV = "HEARTH_API_KEY"


def exposure_warning(host: str, port: int, api_key: str | None) -> str | None:
    """The warning for a bind that other computers can reach without a key, or None."""
    if is_loopback(host) or api_key:
        return None
    return (f"WARNING: serving on {host}:{port} without an API key. Anyone who can reach this address can "
            "run prompts on your model (/v1/chat/completions, /v1/completions), list it (/v1/models) and read "
            f"/metrics. Set {API_KEY_ENV} or pass --api-key-file PATH, or bind to 127.0.0.1.")


def resolve_api_key(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The API key from ``--api-key``, ``--api-key-file`` or ``HEARTH_API_KEY``, in that order.

    Raises:
        ValueError: both flags given, or a key file that cannot be read or is empty.
    """
    if args.api_key and args.api_key_file:
        raise ValueError("give either --api-key or --api-key-file, not both")
    if args.api_key:
        return str(args.api_key)
    if args.api_key_file:
        path = Path(args.api_key_file)
        try:
            key = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the API key file {path}: {exc}") from exc
        if not key:
            raise ValueError(f"the API key file {path} is empty")
        if os.name == "posix" and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            print(f"WARNING: {path} is readable by other users; chmod 600 it.", file=sys.stderr, flush=True)
        return key
    return environ.get(API_KEY_ENV, "").strip() or None


def speculative_option(value: str) -> str | dict[str, str]:
    """``--speculative``'s value as ``EngineConfig.speculative``: a method name, else a draft model's path."""
    return value if value in SPECULATIVE_METHODS else {"draft_model": value}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.serve",
                                     description="Serve a model over an OpenAI-compatible HTTP API.")
    parser.add_argument("--model", default=None,
                        help="'default', a Hugging Face folder, or a .gguf file (default: 'default'; with "
                             "--models-dir, the model a request that names none gets)")
    parser.add_argument("--models-dir", action="append", default=[], type=Path, metavar="DIR",
                        help="serve every model found here and in the usual apps' folders, each loaded when a "
                             "request names it (repeatable)")
    parser.add_argument("--embedding-model", action="append", default=[], type=Path, metavar="PATH",
                        help="an embedding model's folder (bge, e5, gte, nomic-embed, Qwen3-Embedding...) or GGUF "
                             "file (bert, nomic-bert) to serve on /v1/embeddings and Ollama's /api/embed beside the "
                             "chat model, by its folder or file name (repeatable; "
                             "wordllama-l2-256 is always there; with --models-dir, the embedding models found there "
                             "are served too)")
    parser.add_argument("--keep-alive", default="5m", metavar="DURATION",
                        help="with --models-dir: how long a model stays loaded after its last request "
                             "(seconds or 5m, 1h; negative: for ever; default: 5m)")
    parser.add_argument("--max-loaded-models", type=int, default=3, metavar="N",
                        help="with --models-dir: the most models loaded at once (0: no limit; default: 3)")
    parser.add_argument("--memory-budget-mb", type=int, default=0, metavar="MIB",
                        help="with --models-dir: the memory the loaded models may take together (default: 80%% "
                             "of the memory available at start)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this computer)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    parser.add_argument("--api-key", default=None,
                        help=f"require 'Authorization: Bearer KEY' on /v1/* (visible in ps: prefer {API_KEY_ENV} "
                             "or --api-key-file)")
    parser.add_argument("--api-key-file", default=None, metavar="PATH", help="read the API key from this file")
    parser.add_argument("--metrics-auth", action="store_true", help="require the API key on /metrics too")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                        help="a web origin (https://app.example, or *) allowed to call from a browser; repeatable")
    parser.add_argument("--served-model-name", default=None, help="model id to report (default: the model's)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16 (default: auto)")
    parser.add_argument("--quantization", default="auto",
                        help=f"{', '.join(f'{lv} ({LEVEL_LABELS[lv]})' for lv in QUANTIZATION_LEVELS)} (default: auto)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help=f"CPU threads the engine computes with (default: ${THREADS_ENV}, else one per physical "
                             "core)")
    parser.add_argument("--max-batch-size", type=int, default=16, help="most sequences per step (default: 16)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="batching window when idle (default: 5)")
    parser.add_argument("--kv-cache-mb", type=int, default=0, help="KV-cache budget in MiB (default: automatic)")
    parser.add_argument("--max-model-len", type=int, default=None, help="longest prompt plus reply")
    parser.add_argument("--speculative", default="off", metavar="ngram|self-int4|off|PATH",
                        help="speculative decoding: drafts from the request's context (ngram), the model's own int4 "
                             "copy (self-int4), or a draft model folder with the same tokenizer (default: off)")
    parser.add_argument("--num-speculative-tokens", type=int, default=4, help="tokens drafted per step (default: 4)")
    limits = ConnectionLimits()
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help=f"largest request body; bigger ones get 413 (default: {DEFAULT_MAX_BODY_BYTES})")
    parser.add_argument("--max-connections", type=int, default=limits.max_connections,
                        help=f"open connections beyond this get 503 (default: {limits.max_connections})")
    parser.add_argument("--header-timeout", type=float, default=limits.header_timeout_s, metavar="SECONDS",
                        help=f"close a connection whose request headers take longer (default: "
                             f"{limits.header_timeout_s:g})")
    parser.add_argument("--keep-alive-timeout", type=int, default=limits.keep_alive_s, metavar="SECONDS",
                        help=f"close an idle keep-alive connection after this (default: {limits.keep_alive_s})")
    parser.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT_S, metavar="SECONDS",
                        help="a request still running after this ends with finish_reason 'timeout' and keeps its "
                             "text; one that has not started gets a 503 (requests may set their own 'timeout_s'; "
                             f"0: none; default: {DEFAULT_REQUEST_TIMEOUT_S:g})")
    parser.add_argument("--max-requests-per-client", type=int, default=DEFAULT_MAX_REQUESTS_PER_CLIENT,
                        metavar="N", help="generation requests one client address may have in flight; more get "
                        f"429 with Retry-After (0: no limit; default: {DEFAULT_MAX_REQUESTS_PER_CLIENT})")
    parser.add_argument("--write-timeout", type=float, default=limits.write_timeout_s, metavar="SECONDS",
                        help="drop a connection whose client takes none of its reply for this long, cancelling "
                             f"its request (default: {limits.write_timeout_s:g})")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def _settings(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[GuardRules, ConnectionLimits]:
    """The guard rules and connection limits the arguments ask for; ``ValueError`` names a bad one."""
    api_key = resolve_api_key(args, environ)
    if not 0 <= args.request_timeout < float("inf"):
        raise ValueError(f"--request-timeout must be 0 (none) or a positive number of seconds, got {args.request_timeout:g}")
    if args.metrics_auth and not api_key:
        raise ValueError(f"--metrics-auth needs an API key ({API_KEY_ENV}, --api-key-file or --api-key)")
    rules = GuardRules(api_key=api_key, metrics_auth=args.metrics_auth, check_host=is_loopback(args.host),
                       allowed_origins=tuple(args.allow_origin), max_body_bytes=args.max_body_bytes,
                       max_requests_per_client=args.max_requests_per_client)
    limits = ConnectionLimits(header_timeout_s=args.header_timeout, keep_alive_s=args.keep_alive_timeout,
                              max_connections=args.max_connections, write_timeout_s=args.write_timeout)
    return rules, limits


#: The GIL switch interval while serving (Python's default is 5 ms).
SWITCH_INTERVAL_S = 0.0005


def main(argv: list[str] | None = None) -> int:
    """Load the model and serve until interrupted. Returns 2 on bad settings, or when the model cannot be
    loaded or the port bound."""
    args = _parser().parse_args(argv)
    # the engine's loop thread and the event loop share the GIL: with the default 5 ms switch interval, each time
    # one hands it to the other mid-work the other may wait up to 5 ms for it back (the convoy effect)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)-7s %(name)s %(message)s")
    try:
        rules, limits = _settings(args, os.environ)
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be a positive whole number, got {args.threads}")
        threads = args.threads or requested_threads(os.environ)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if threads is not None:
        configure_threads(threads=threads)
    pool_settings: dict[str, Any] = {}
    if args.models_dir:
        from engine.serving.headless import pool_options

        missing = [str(d) for d in args.models_dir if not d.is_dir()]
        try:
            if missing:
                raise ValueError(f"--models-dir {', '.join(missing)} is not a folder")
            pool_settings = pool_options(args)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    warning = exposure_warning(args.host, args.port, rules.api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    from engine.core.llm import LLM

    options: dict[str, Any] = {"max_batch_size": args.max_batch_size, "max_wait_ms": args.max_wait_ms,
                               "max_model_len": args.max_model_len,
                               "speculative": speculative_option(args.speculative),
                               "num_speculative_tokens": args.num_speculative_tokens}
    if args.kv_cache_mb:
        options["kv_cache_bytes"] = args.kv_cache_mb * 1024 * 1024
    if args.models_dir:
        return _serve_many(args, options, pool_settings, rules, limits, sock)
    model = args.model or "default"
    from engine.serving.embeddings import LocalEmbeddings

    try:
        embeddings = LocalEmbeddings(args.embedding_model)
    except (OSError, ValueError, ImportError) as exc:
        sock.close()
        print(f"error: --embedding-model: {exc}", file=sys.stderr)
        return 2
    try:
        llm = LLM(model, device=args.device, dtype=args.dtype, quantization=args.quantization,
                  start_loop=True, **options)
    except (ModelLoadError, ValueError, TypeError) as exc:
        sock.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    name = args.served_model_name or llm.model_name
    app = create_app(AsyncLLMEngine(llm), name, rules, aliases=("default", str(model)),
                     request_timeout_s=args.request_timeout or None, sampling_defaults=llm.sampling_defaults,
                     embeddings=embeddings)
    embedders = ", ".join(m.name for m in embeddings.models)
    print(f"Hearth is serving {name} on {llm.device} at http://{args.host}:{args.port}/v1"
          + (f", and the embedding model(s) {embedders}" if embedders else "")
          + (" (API key required)" if rules.api_key else ""), flush=True)
    try:
        uvicorn_server(app, limits, args.log_level).run(sockets=[sock])
    finally:
        llm.close()
        sock.close()
    return 0


def _serve_many(args: argparse.Namespace, options: dict[str, Any], pool_settings: dict[str, Any],
                rules: GuardRules, limits: ConnectionLimits, sock: Any) -> int:
    """Serve every model on disk by name (``--models-dir``) until interrupted."""
    from engine.core.llm import LLM
    from engine.docs.embedders import open_model_embedder
    from engine.serving.headless import disk_catalog, embedding_entries, log_to_data_folder
    from engine.serving.multi_app import create_multi_app
    from engine.serving.pool import Entry, ModelPool

    try:
        extra = embedding_entries(args.embedding_model)
    except (OSError, ValueError) as exc:
        sock.close()
        print(f"error: --embedding-model: {exc}", file=sys.stderr)
        return 2

    def load(entry: Entry) -> Any:
        if entry.kind == "embedding":
            return open_model_embedder(entry.path)
        return LLM(entry.path, device=args.device, dtype=args.dtype, quantization=args.quantization,
                   start_loop=True, **options)

    def catalog() -> list[Entry]:
        named = {e.name for e in extra}
        return [*extra, *(e for e in disk_catalog(args.models_dir) if e.name not in named)]

    log_path = log_to_data_folder(args.log_level)
    pool = ModelPool(catalog, load, default_name=args.model,
                     request_timeout_s=args.request_timeout or None, **pool_settings)
    names = [e.name for e in pool.entries()]
    print(f"Hearth is serving {len(names)} model(s) at http://{args.host}:{args.port}/v1, each loaded when a "
          f"request names it: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}"
          + (" (API key required)" if rules.api_key else "") + f"; log: {log_path}", flush=True)
    try:
        uvicorn_server(create_multi_app(pool, rules), limits, args.log_level).run(sockets=[sock])
    finally:
        pool.close_now()
        sock.close()
    return 0
