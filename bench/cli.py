"""`python -m bench compare`: start both servers, run the workloads, write the report.

Both servers start at once on free 127.0.0.1 ports (same model, same parser flags) and are
measured one after the other, so the idle one costs nothing; the noise check alternates between
them. Whatever happens (error, Ctrl-C, SIGTERM), both process groups are stopped on the way out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import secrets
import shlex
import signal
import sys
from pathlib import Path

import msgspec

from bench import peer, report
from bench.plan import FULL, QUICK, Inputs, Progress
from bench.results import (
    ERROR,
    NOT_IMPLEMENTED,
    OURS,
    PEER,
    Meta,
    Outcome,
    Results,
    decode,
)
from bench.runner import Runner
from bench.servers import Server, ServerDown, free_port, load_average

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO.parent / "shared" / "models" / "qwen3"
MODEL_HELP = (
    "pass --model DIR, any local model directory (tokenizer files, chat template, config.json; "
    "no weights) whose tokenizer has Qwen3's <think>, </think>, <tool_call>, </tool_call> and "
    "<|im_end|> tokens: the workloads write that markup and both servers run with "
    "--reasoning-parser qwen3 --tool-call-parser hermes"
)
PARSER_FLAGS = [
    "--reasoning-parser",
    "qwen3",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
]


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, {platform.system()}"


def _terminate(signum: int, frame: object) -> None:
    # Turn SIGTERM into the same unwinding as Ctrl-C, so the finally blocks stop the servers.
    raise KeyboardInterrupt(f"signal {signum}")


def compare(args: argparse.Namespace) -> int:
    say = Progress()
    plan = QUICK if args.quick else FULL
    if args.stream_budget:
        plan = msgspec.structs.replace(plan, stream_budget_s=args.stream_budget)
    if args.stream_n:
        plan = msgspec.structs.replace(plan, stream_n=args.stream_n)
    model = Path(args.model).resolve()
    if not (model / "config.json").is_file():
        raise SystemExit(f"python -m bench compare: no model directory at {model}: {MODEL_HELP}")
    out_dir = Path(args.out)
    started = dt.datetime.now(dt.UTC)
    venv = peer.venv_dir(args.vllm_venv)
    peer.ensure_installed(venv, log=say)
    say(f"building inputs with the tokenizer of {model}")
    data = Inputs(model, plan)

    secret = secrets.token_hex(16)
    ours_flags = [*PARSER_FLAGS, "--state-secret", secret]
    if args.workers:
        ours_flags += ["--workers", str(args.workers)]
    ports = {PEER: free_port(), OURS: free_port()}
    commands = {
        PEER: peer.server_command(venv, Path(model.name), ports[PEER], PARSER_FLAGS),
        OURS: ours_command(args.ours_cmd, model.name, ports[OURS], ours_flags),
    }
    ours_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    envs = {PEER: peer.server_env(), OURS: ours_env}
    shown = {k: " ".join(v).replace(secret, "<random>") for k, v in commands.items()}
    results = Results(
        Meta(
            started_utc=started.isoformat(timespec="seconds"),
            finished_utc="",
            quick=args.quick,
            model=str(model),
            parser_flags=PARSER_FLAGS,
            machine=_machine(),
            commands=shown,
            system_notes={},
            settings={k: str(v) for k, v in msgspec.structs.asdict(plan).items()},
        )
    )
    results.meta.load_average["start"] = load_average()
    runner = Runner(results, plan, data, say)
    servers: dict[str, Server] = {}
    previous = signal.signal(signal.SIGTERM, _terminate)
    log_dir = REPO / "bench" / ".work" / "logs"
    try:
        for name in (PEER, OURS):
            say(f"starting {name} on port {ports[name]}")
            # Both run from the model's parent so the served model name is the directory name.
            servers[name] = Server(
                name,
                commands[name],
                envs[name],
                model.parent,
                ports[name],
                log_dir / f"{name.split()[0]}.log",
            )
        up: dict[str, Server] = {}
        for name, server in servers.items():
            try:
                server.wait_healthy(180.0 if name == PEER else 60.0)
                up[name] = server
                say(f"{name} is healthy (pid {server.pid})")
            except ServerDown as exc:
                status = NOT_IMPLEMENTED if name == OURS else ERROR
                results.meta.system_notes[name] = f"did not start: {exc}"
                runner.unavailable(name, Outcome(status, f"server did not start: {exc}"[:200]))
                say(f"{name} did not start: {exc}")
        for round_ in range(plan.noise_rounds):
            for name, server in up.items():
                runner.noise_round(name, server)
            say(f"noise round {round_ + 1} of {plan.noise_rounds} done")
        for name, server in up.items():
            runner.all(name, server)
    finally:
        for server in servers.values():
            server.stop()
            say(f"stopped {server.name} (pid {server.pid})")
        signal.signal(signal.SIGTERM, previous)

    results.meta.finished_utc = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    results.meta.load_average["end"] = load_average()
    name = args.name or ("quick" if args.quick else "full")
    written = report.write(results, out_dir, f"{started:%Y-%m-%d}-{name}")
    for path in written:
        say(f"wrote {path}")
    return 0


def ours_command(template: str, model: str, port: int, flags: list[str]) -> list[str]:
    """render-service's command line; `--ours-cmd` may replace it ({model}, {port}, {flags})."""
    if not template:
        return [
            sys.executable,
            "-m",
            "render_service",
            "serve",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *flags,
        ]
    words = shlex.split(
        template.format(model=shlex.quote(model), port=port, flags=shlex.join(flags))
    )
    return words


def _stream_lengths(text: str) -> tuple[int, ...]:
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of chunk counts: {text!r}") from None
    if min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"not a list of chunk counts: {text!r}")
    return lengths


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="measure render-service and vLLM 0.33.0 side by side")
    cmp.add_argument("--quick", action="store_true", help="the small plan (bench/README.md)")
    cmp.add_argument(
        "--model",
        default=str(DEFAULT_MODEL),
        help="a local Qwen3-family model directory (default: ../shared/models/qwen3)",
    )
    cmp.add_argument("--out", default=str(REPO / "bench" / "results"), help="report directory")
    cmp.add_argument(
        "--name", default="", help="short name in the report file name (default: quick/full)"
    )
    cmp.add_argument(
        "--vllm-venv",
        default=None,
        help=f"peer venv (env {peer.VENV_ENV}; default {peer.DEFAULT_VENV})",
    )
    cmp.add_argument(
        "--ours-cmd",
        default="",
        help="command template for render-service with {model} {port} {flags} "
        "(default: this interpreter with -m render_service serve)",
    )
    cmp.add_argument(
        "--stream-budget",
        type=float,
        default=0.0,
        help="wall-time cap in s for one streaming-derender run (default: 45 quick, 600 full)",
    )
    cmp.add_argument(
        "--stream-n",
        type=_stream_lengths,
        default=(),
        help="streaming-derender lengths in chunks, e.g. 256,1024,4096 (default: the plan's)",
    )
    cmp.add_argument(
        "--workers", type=int, default=0, help="--workers for render-service (default: its own)"
    )
    again = sub.add_parser("report", help="redraw a report from its raw JSON")
    again.add_argument("json", help="a <date>-<name>.json written by compare")
    sub.add_parser("install-peer", help="only install vLLM 0.33.0 into its venv").add_argument(
        "--vllm-venv", default=None
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "report":
        raw = Path(args.json)
        for path in report.write(decode(raw.read_bytes()), raw.parent, raw.stem):
            print(f"wrote {path}")
        return 0
    if args.command == "install-peer":
        peer.ensure_installed(peer.venv_dir(args.vllm_venv))
        return 0
    try:
        return compare(args)
    except KeyboardInterrupt:
        print("interrupted: servers stopped", file=sys.stderr)
        return 130
