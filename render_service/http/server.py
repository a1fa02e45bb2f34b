"""Running the app under uvicorn, with one or more server processes."""

from __future__ import annotations

import errno
import gc
import io
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec
import uvicorn
from starlette.applications import Starlette

from render_service import __version__
from render_service.http import listeners
from render_service.settings import Settings

# The path of the settings file the parent writes for its workers (the file, not the variable,
# holds the secrets: environment variables reach every child process and /proc/PID/environ).
SETTINGS_FILE_ENV = "RENDER_SERVICE_SETTINGS_FILE"
# The pid of the process supervising worker processes (set only with more than one worker).
SUPERVISOR_PID_ENV = "RENDER_SERVICE_SUPERVISOR_PID"
# Read by prometheus_client when it is imported in each worker (render_service.http.metrics).
_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# How long in-flight requests may run after SIGTERM before uvicorn cancels them. Keep it below
# the orchestrator's kill deadline (Kubernetes terminationGracePeriodSeconds, compose stop_grace_period).
GRACEFUL_SHUTDOWN_SECONDS = 30
log = logging.getLogger("render_service")


def create_app() -> Starlette:
    """uvicorn factory: each worker process rebuilds the app from the settings its parent wrote."""
    from render_service.http import connections, lifecycle
    from render_service.http.app import build_app
    from render_service.render import Renderer

    settings = read_settings_file(os.environ[SETTINGS_FILE_ENV])
    connections.configure(connections.ConnectionLimits.from_settings(settings))
    # Worker processes are spawned fresh: logging set up in the parent does not reach them.
    _configure_logging(settings.log_level)
    try:
        renderer = Renderer.from_settings(settings)
    except Exception as exc:
        _stop_server(f"{type(exc).__name__}: {exc}")
        raise
    tune_thread_switching(renderer.multimodal is not None)
    app = build_app(renderer)
    connections.serve_directly(app.state.direct)
    tune_garbage_collection()
    # uvicorn calls this factory inside its capture_signals(), so its SIGTERM handler is in place
    # and /ready can turn 503 the moment the drain starts.
    lifecycle.chain_drain_signal()
    return app


#: Net new container objects between two young collections (Python's default is 700). A
#: multi-stream call holds ~15 per item until its answer is encoded (~4,000 at 256 streams), so
#: at 700 every call ran several young collections that walked and promoted those live objects,
#: ~15-40 ms per 4,096 chunks; above the call's peak they are freed before a collection runs.
GC_YOUNG_THRESHOLD = 20_000


def tune_garbage_collection() -> None:
    """Take what the worker has loaded (model, tokenizer, templates, code) out of the garbage
    collector's sight, and collect the young generation less often.

    What is loaded lives as long as the process, yet a full collection walked all of it: on
    Qwen3 70-240 ms of CPU every few thousand streamed chunks, which made short measurements jump
    by hundreds of microseconds per chunk; after the freeze it scans only what requests made.
    Garbage is collected first, so none of it is kept forever.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


# How long a worker process may take to load its model before uvicorn restarts it. uvicorn's
# default (5 s) is shorter than loading gpt-oss's 27 MB tokenizer on a busy 2-core machine,
# which then restarts the worker forever.
WORKER_STARTUP_SECONDS = 120

# How long a thread may hold the GIL while another waits for it, in image servers. Media threads
# give the GIL up around every decode, kernel and base64 call and need it back after; at
# Python's default (5 ms) each return can wait that long behind the event loop. One no-peer
# bench round each (bench/mm_bench.py): text p99 under image load 11.9 ms at 0.5 ms vs 15-17 ms
# at 5 ms, 1-image throughput 64 vs 55 req/s.
IMAGE_SWITCH_INTERVAL = 0.0005


def tune_thread_switching(serves_images: bool) -> None:
    """Shorter GIL hand-overs for image servers; text-only servers keep Python's default."""
    if serves_images:
        sys.setswitchinterval(IMAGE_SWITCH_INTERVAL)


def _failure_path(settings_path: str) -> str:
    return os.path.join(os.path.dirname(settings_path), "worker-failure.txt")


def _stop_server(reason: str) -> None:
    """A worker that cannot build its app stops the whole server with the reason: every worker
    would fail the same way, and uvicorn's supervisor respawns dead workers forever."""
    with open(_failure_path(os.environ[SETTINGS_FILE_ENV]), "w", encoding="utf-8") as f:
        f.write(" ".join(reason.split()))
    supervisor = os.environ.get(SUPERVISOR_PID_ENV)
    if supervisor is not None and int(supervisor) == os.getppid():
        os.kill(os.getppid(), signal.SIGTERM)


def _worker_failure(settings_path: str) -> str | None:
    try:
        with open(_failure_path(settings_path), encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _drained(signum: int, frame: FrameType | None) -> None:
    """uvicorn re-raises the signal after a clean drain; ending here makes the exit status 0."""


def _configure_logging(log_level: str) -> None:
    from render_service.http import metrics

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Access lines are JSON objects, one per line on stdout (other logs go to stderr), written
    # at "info" and below; "debug" adds the probes. Line buffering: a log that trails behind
    # the traffic is useless when a replica dies.
    level = logging.getLevelName(log_level.upper())
    on = isinstance(level, int) and level <= logging.INFO
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)
    metrics.access_log.configure(sys.stdout if on else None, probes=level == logging.DEBUG)


class StartupError(Exception):
    """The server cannot start; the message says why in one line (raised before any worker)."""


# Placeholder values shipped in examples over the years; a secret containing one is refused.
_PLACEHOLDERS = ("replace-me", "replace_me", "changeme", "change-me", "placeholder")
#: The shortest state secret accepted, in bytes (HMAC-SHA256 keys shorter than that are weak).
MIN_SECRET_BYTES = 32
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "tekken.json",
)


def check_startup(settings: Settings) -> None:
    """Everything that would make every worker fail, checked once in the parent (StartupError,
    or MissingImageExtra for an image model without the image stack)."""
    secret = settings.state_secret
    if secret is not None:
        lowered = secret.lower()
        if any(p in lowered for p in _PLACEHOLDERS):
            raise StartupError(
                "the state secret is a placeholder from an example; set a random one "
                "(openssl rand -hex 32)"
            )
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise StartupError(
                f"the state secret is {len(secret.encode())} bytes; use at least "
                f"{MIN_SECRET_BYTES} random bytes (openssl rand -hex 32)"
            )
    from render_service.model.harmony import HARMONY_MODEL_TYPES
    from render_service.model.loading import (
        load_chat_template_arg,
        max_context_length,
        read_json,
        resolve_model_path,
    )
    from render_service.model.parser_setup import harmony_parser_flags

    path = _model_path(settings)
    tokenizer = path
    if settings.tokenizer is not None:
        try:
            tokenizer = resolve_model_path(
                settings.tokenizer, settings.tokenizer_revision, "tokenizer"
            )
        except FileNotFoundError as exc:
            raise StartupError(str(exc)) from exc
    if not any((tokenizer / name).is_file() for name in _TOKENIZER_FILES):
        raise StartupError(f"{settings.tokenizer or settings.model!r} has no tokenizer files")
    if read_json(path / "config.json").get("model_type") in HARMONY_MODEL_TYPES:
        try:
            harmony_parser_flags(settings)
        except ValueError as exc:
            raise StartupError(str(exc)) from None
    limit = max_context_length(path)
    if settings.max_model_len is not None and settings.max_model_len > limit:
        raise StartupError(
            f"--max-model-len {settings.max_model_len} is larger than the model's context "
            f"length {limit}"
        )
    if settings.chat_template is not None:
        try:
            load_chat_template_arg(settings.chat_template)
        except (FileNotFoundError, OSError) as exc:
            raise StartupError(str(exc)) from None
    _require_extras(path, settings)


def serve(settings: Settings) -> None:
    """Run the server until SIGTERM or SIGINT, then drain and return.

    StartupError or MissingImageExtra, before any worker starts, for a server that cannot run.
    """
    _configure_logging(settings.log_level)
    check_startup(settings)
    _check_address(settings.host, settings.port)
    if settings.state_secret is None:
        log.warning(
            "No --state-secret (or RENDER_SERVICE_STATE_SECRET): a random secret signs stream_state, "
            "so a stream CANNOT move to another replica. Give every replica the same secret."
        )
        # One secret for all worker processes of this server, so its own workers agree.
        settings = msgspec.structs.replace(settings, state_secret=secrets.token_hex(32))
    workers = settings.server_workers
    log.info("%s", startup_line(settings))
    metrics_dir = _multiprocess_metrics_dir() if workers > 1 else None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _drained)
    with settings_file(settings) as path:
        os.environ[SETTINGS_FILE_ENV] = path
        if workers > 1:
            os.environ[SUPERVISOR_PID_ENV] = str(os.getpid())
        try:
            _run_uvicorn(settings, workers)
        except (Exception, SystemExit):  # the app factory's error, with one in-process worker
            if _worker_failure(path) is None:
                raise
            log.debug("the app could not be built", exc_info=True)
        finally:
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)
        failure = _worker_failure(path)
    if failure is not None:
        raise StartupError(f"a worker process could not start: {failure}")


def _run_uvicorn(settings: Settings, workers: int) -> None:
    app = "render_service.http.server:create_app"
    options: dict[str, Any] = {
        "factory": True,
        "host": settings.host,
        "port": settings.port,
        "workers": workers,
        "loop": "uvloop",
        # uvicorn's httptools protocol with header and connection limits.
        "http": "render_service.http.connections:LimitedHttpToolsProtocol",
        "log_level": settings.log_level,
        "access_log": False,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_SECONDS,
        "timeout_worker_healthcheck": WORKER_STARTUP_SECONDS,
    }
    if workers > 1 and listeners.available():
        listeners.run_workers(uvicorn.Config(app, **options))
    else:
        uvicorn.run(app, **options)


def startup_line(settings: Settings) -> str:
    """What this server serves, with which parsers, in how many processes, where."""
    parsers = [
        f"{kind} parser {name}"
        for kind, name in (
            ("reasoning", settings.reasoning_parser),
            ("tool-call", settings.tool_call_parser if settings.enable_auto_tool_choice else None),
        )
        if name not in (None, "", "none")
    ]
    workers = settings.server_workers
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return (
        f"render-service {__version__} serving {settings.model_name!r} ({settings.model}) with "
        f"{', '.join(parsers) or 'no parsers'}; {workers} worker process{'es' * (workers > 1)} "
        f"x {settings.renderer_num_workers} render thread"
        f"{'s' * (settings.renderer_num_workers > 1)}; http://{host}:{settings.port}"
    )


def _model_path(settings: Settings) -> Path:
    """The model's directory, checked here so a wrong path is one line, not a crash per worker."""
    from render_service.model.loading import resolve_model_path

    try:
        return resolve_model_path(settings.model, settings.revision)
    except FileNotFoundError as exc:
        raise StartupError(str(exc)) from exc


def _require_extras(path: Path, settings: Settings) -> None:
    from render_service.multimodal import require_image_stack, takes_images

    if takes_images(path):
        require_image_stack(settings.model_name)


def _check_address(host: str, port: int) -> None:
    """Bind the address once (as uvicorn will, with SO_REUSEADDR) so that a port in use or a
    host that is not this machine's is reported with the address, before any worker starts."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        hint = " (another server is running there: choose another --port)"
        reason = exc.strerror or str(exc)
        in_use = exc.errno == errno.EADDRINUSE
        raise StartupError(f"cannot listen on {shown}: {reason}{hint if in_use else ''}") from exc


@contextmanager
def settings_file(settings: Settings) -> Iterator[str]:
    """The settings (secrets included) in a file only this user can read, removed on exit."""
    folder = tempfile.mkdtemp(prefix="render-service-")  # mode 0700
    path = os.path.join(folder, "settings.json")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.json.encode(settings))
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def read_settings_file(path: str) -> Settings:
    with open(path, "rb") as f:
        return msgspec.json.decode(f.read(), type=Settings)


def _multiprocess_metrics_dir() -> str | None:
    """Give worker processes one fresh directory for their metric files, so /metrics sums them.

    Returns the directory to remove at exit, or None when the operator chose one.
    """
    if os.environ.get(_MULTIPROC_ENV):
        return None
    path = tempfile.mkdtemp(prefix="render-service-metrics-")
    os.environ[_MULTIPROC_ENV] = path
    return path
