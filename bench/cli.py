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
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

from bench import inputs, measure, peer, report
from bench.measure import CHAT_DERENDER, CHAT_RENDER, Failure
from bench.results import (
    ERROR,
    NOT_IMPLEMENTED,
    OURS,
    OURS_LEAN,
    PEER,
    SKIPPED,
    BatchRow,
    BytesRow,
    LatencyRow,
    Meta,
    NoiseRow,
    Outcome,
    Results,
    StreamRow,
    ThroughputRow,
    decode,
)
from bench.servers import Server, ServerDown, free_port

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO.parent / "shared" / "models" / "qwen3"
PARSER_FLAGS = [
    "--reasoning-parser",
    "qwen3",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
]


class Plan(msgspec.Struct, frozen=True):
    """How much of each workload to run; --quick picks the small plan."""

    latency_sizes: tuple[int, ...] = (1000, 9000, 32000)
    latency_reps: int = 100
    warmup: int = 3
    noise_rounds: int = 3
    concurrency: tuple[int, ...] = (1, 4, 16, 64)
    throughput_s: float = 5.0
    throughput_max_requests: int = 20000
    stream_n: tuple[int, ...] = (256, 1024, 4096, 16384)
    ours_only_n: int = 16384
    stream_budget_s: float = 600.0
    batch_reps: int = 20
    bytes_prompts: tuple[int, ...] = (1000, 32000)
    bytes_chunks: int = 128


FULL = Plan()
QUICK = Plan(
    latency_reps=20,
    warmup=2,
    throughput_s=1.5,
    stream_n=(256, 1024),
    stream_budget_s=75.0,
    batch_reps=5,
    bytes_chunks=32,
)


def _label(tokens: int) -> str:
    return f"{tokens // 1000}k"


class Progress:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)


class Inputs:
    """Everything sent to the servers, built once from the model's tokenizer."""

    def __init__(self, model_dir: Path, plan: Plan):
        tok = inputs.Tokenizer(model_dir)
        self.model = model_dir.name
        sizes = sorted({*plan.latency_sizes, *plan.bytes_prompts})
        self.messages = {size: inputs.chat_messages(tok, size) for size in sizes}
        self.prompt_ids = {
            (size, tools): tok.chat_ids(self.messages[size], inputs.TOOLS if tools else None)
            for size in sizes
            for tools in (False, True)
        }
        self.outputs = {n: inputs.output_ids(tok, n) for n in plan.stream_n}

    def render_body(self, size: int, tools: bool) -> bytes:
        return msgspec.json.encode(inputs.chat_request(self.model, self.messages[size], tools))

    def stream_base(self, size: int) -> dict[str, Any]:
        ids = self.prompt_ids[(size, True)]
        return {
            "model": self.model,
            "prompt_tokens": len(ids),
            "prompt_token_ids": ids,
            "chat_request": inputs.chat_request(self.model, self.messages[size], True, stream=True),
        }

    def batch_body(self, size: int, n: int) -> bytes:
        ids = self.prompt_ids[(size, True)]
        return msgspec.json.encode(
            {
                "model": self.model,
                "generate_response": measure.generate_response(
                    f"generate-tokens-chatcmpl-bench-batch-{n}",
                    self.model,
                    len(ids),
                    self.outputs[n],
                ),
                "prompt_tokens": len(ids),
                "prompt_token_ids": ids,
                "chat_request": inputs.chat_request(self.model, self.messages[size], True),
            }
        )


class Runner:
    """Runs every workload against one system and appends rows to `results`."""

    def __init__(self, results: Results, plan: Plan, data: Inputs, say: Progress):
        self.results = results
        self.plan = plan
        self.data = data
        self.say = say
        self.finals: dict[tuple[str, int], measure.FinalMessage] = {}

    def latency(self, name: str, server: Server) -> None:
        with httpx.Client(base_url=server.base_url, timeout=300.0) as client:
            for size in self.plan.latency_sizes:
                for tools in (False, True):
                    tokens = len(self.data.prompt_ids[(size, tools)])
                    row = LatencyRow(name, _label(size), tools, tokens, Outcome())
                    try:
                        timing = measure.time_requests(
                            client,
                            server.cpu_seconds,
                            CHAT_RENDER,
                            self.data.render_body(size, tools),
                            self.plan.latency_reps,
                            self.plan.warmup,
                            "render",
                        )
                        row.requests = len(timing.samples_ms)
                        row.median_ms = timing.median_ms
                        row.p99_ms = measure.percentile(timing.samples_ms, 99)
                        row.server_cpu_ms_per_request = 1000 * timing.server_cpu_s / row.requests
                    except Failure as failure:
                        row.outcome = failure.outcome
                    self.results.render_latency.append(row)
                    done = f"median {row.median_ms:.2f} ms, p99 {row.p99_ms:.2f} ms"
                    what = f"render {row.label}{' +tools' if tools else ''} ({tokens} tok)"
                    self.say(f"{name}: {what}: {_show(row.outcome, done)}")

    def noise_round(self, name: str, server: Server) -> None:
        """One repeat of two small workloads; the spread over repeats is the report's noise."""
        size, n = self.plan.latency_sizes[0], self.plan.stream_n[0]
        render = self._noise_row(name, f"render {_label(size)} chat, median latency", "ms")
        if render.outcome.ok:
            with httpx.Client(base_url=server.base_url, timeout=300.0) as client:
                try:
                    timing = measure.time_requests(
                        client,
                        server.cpu_seconds,
                        CHAT_RENDER,
                        self.data.render_body(size, False),
                        self.plan.latency_reps,
                        self.plan.warmup,
                        "render",
                    )
                    render.values.append(timing.median_ms)
                except Failure as failure:
                    render.outcome = failure.outcome
        stream = self._noise_row(name, f"streaming derender n={n}, server CPU", "s")
        if stream.outcome.ok:
            with httpx.Client(base_url=server.base_url, timeout=600.0) as client:
                run = measure.stream_derender(
                    client,
                    server.cpu_seconds,
                    self.data.stream_base(size),
                    self.data.outputs[n],
                    False,
                    self.plan.stream_budget_s,
                    f"generate-tokens-chatcmpl-bench-noise-{n}",
                )
            if run.outcome.ok:
                stream.values.append(run.server_cpu_s)
            else:
                stream.outcome = run.outcome
        for row in (render, stream):
            done = f"{row.values[-1]:.3f} {row.unit}" if row.values else ""
            self.say(f"{name}: noise, {row.label}: {_show(row.outcome, done)}")

    def _noise_row(self, name: str, label: str, unit: str) -> NoiseRow:
        for row in self.results.latency_noise:
            if row.system == name and row.label == label:
                return row
        row = NoiseRow(name, label, unit, Outcome())
        self.results.latency_noise.append(row)
        return row

    def throughput(self, name: str, server: Server) -> None:
        size = self.plan.latency_sizes[0]
        body = self.data.render_body(size, False)
        tokens = len(self.data.prompt_ids[(size, False)])
        for clients in self.plan.concurrency:
            row = ThroughputRow(name, clients, tokens, Outcome())
            try:
                result = measure.throughput(
                    server.base_url,
                    server.cpu_seconds,
                    CHAT_RENDER,
                    body,
                    clients,
                    self.plan.throughput_s,
                    self.plan.throughput_max_requests,
                )
                row.requests = result.requests
                row.seconds = result.seconds
                row.requests_per_s = result.requests / result.seconds
                row.server_cpu_s = result.server_cpu_s
                row.client_cpu_s = result.client_cpu_s
            except Failure as failure:
                row.outcome = failure.outcome
            self.results.throughput.append(row)
            done = f"{row.requests_per_s:.1f} req/s"
            self.say(f"{name}: throughput x{clients}: {_show(row.outcome, done)}")

    def streams(self, name: str, server: Server, lean: bool) -> None:
        row_name = OURS_LEAN if lean else name
        size = self.plan.latency_sizes[0]
        base = self.data.stream_base(size)
        history: list[tuple[int, float]] = []
        with httpx.Client(base_url=server.base_url, timeout=600.0) as client:
            blocked: Outcome | None = None
            for n in self.plan.stream_n:
                row = StreamRow(row_name, n, Outcome())
                guess = measure.predicted_stream_s(history, n)
                if blocked is not None:
                    row.outcome = blocked
                elif name == PEER and n >= self.plan.ours_only_n:
                    row.outcome = Outcome(
                        SKIPPED, f"render-service only (predicted {_secs(guess)} for vLLM)"
                    )
                elif guess is not None and guess > self.plan.stream_budget_s:
                    row.outcome = Outcome(
                        SKIPPED,
                        f"not run: predicted {_secs(guess)} from the smaller runs, over the "
                        f"{self.plan.stream_budget_s:.0f} s budget",
                    )
                else:
                    run = measure.stream_derender(
                        client,
                        server.cpu_seconds,
                        base,
                        self.data.outputs[n],
                        lean,
                        self.plan.stream_budget_s,
                        f"generate-tokens-chatcmpl-bench-stream-{n}",
                    )
                    row.outcome, row.calls, row.wall_s, row.server_cpu_s = (
                        run.outcome,
                        run.calls,
                        run.wall_s,
                        run.server_cpu_s,
                    )
                    if run.outcome.ok:
                        history.append((n, run.wall_s))
                        if run.final is not None:
                            self.finals[(row_name, n)] = run.final
                            row.final_summary = run.final.summary()
                        peer_final = self.finals.get((PEER, n))
                        if name != PEER and peer_final is not None and run.final is not None:
                            row.final_matches_peer = peer_final == run.final
                self.results.stream_derender.append(row)
                done = f"server CPU {row.server_cpu_s:.2f} s, wall {row.wall_s:.2f} s"
                self.say(f"{row_name}: stream derender n={n}: {_show(row.outcome, done)}")
                if row.outcome.status == NOT_IMPLEMENTED:
                    blocked = row.outcome

    def batches(self, name: str, server: Server) -> None:
        size = self.plan.latency_sizes[0]
        with httpx.Client(base_url=server.base_url, timeout=600.0) as client:
            for n in self.plan.stream_n:
                row = BatchRow(name, n, Outcome())
                try:
                    timing = measure.time_requests(
                        client,
                        server.cpu_seconds,
                        CHAT_DERENDER,
                        self.data.batch_body(size, n),
                        self.plan.batch_reps,
                        1,
                        "derender",
                    )
                    row.requests = len(timing.samples_ms)
                    row.median_ms = timing.median_ms
                    row.server_cpu_ms_per_request = 1000 * timing.server_cpu_s / row.requests
                except Failure as failure:
                    row.outcome = failure.outcome
                self.results.batch_derender.append(row)
                done = f"median {row.median_ms:.1f} ms"
                self.say(f"{name}: batch derender n={n}: {_show(row.outcome, done)}")

    def bytes_per_chunk(self, name: str, server: Server, lean: bool) -> None:
        row_name = OURS_LEAN if lean else name
        n = self.plan.stream_n[0]
        ids = self.data.outputs[n][: self.plan.bytes_chunks]
        with httpx.Client(base_url=server.base_url, timeout=600.0) as client:
            for size in self.plan.bytes_prompts:
                base = self.data.stream_base(size)
                run = measure.stream_derender(
                    client,
                    server.cpu_seconds,
                    base,
                    ids,
                    lean,
                    self.plan.stream_budget_s,
                    f"generate-tokens-chatcmpl-bench-bytes-{size}",
                )
                row = BytesRow(row_name, base["prompt_tokens"], run.outcome, chunks=run.calls)
                if run.request_bytes:
                    row.request_bytes_mean = sum(run.request_bytes) / len(run.request_bytes)
                    row.request_bytes_last = run.request_bytes[-1]
                    row.response_bytes_mean = sum(run.response_bytes) / len(run.response_bytes)
                    row.response_bytes_last = run.response_bytes[-1]
                self.results.bytes_per_chunk.append(row)
                done = (
                    f"request {row.request_bytes_mean:.0f} B, "
                    f"response {row.response_bytes_mean:.0f} B"
                )
                what = f"bytes per chunk, {_label(size)} prompt"
                self.say(f"{row_name}: {what}: {_show(row.outcome, done)}")

    def all(self, name: str, server: Server) -> None:
        self.latency(name, server)
        self.throughput(name, server)
        self.streams(name, server, lean=False)
        if name == OURS:
            self.streams(name, server, lean=True)
        self.batches(name, server)
        self.bytes_per_chunk(name, server, lean=False)
        if name == OURS:
            self.bytes_per_chunk(name, server, lean=True)

    def unavailable(self, name: str, outcome: Outcome) -> None:
        """Rows for a system that could not be started, so the report still lists them."""
        plan, data, res = self.plan, self.data, self.results
        for size in plan.latency_sizes:
            for tools in (False, True):
                tokens = len(data.prompt_ids[(size, tools)])
                res.render_latency.append(LatencyRow(name, _label(size), tools, tokens, outcome))
        size, n = plan.latency_sizes[0], plan.stream_n[0]
        res.latency_noise.append(
            NoiseRow(name, f"render {_label(size)} chat, median latency", "ms", outcome)
        )
        res.latency_noise.append(
            NoiseRow(name, f"streaming derender n={n}, server CPU", "s", outcome)
        )
        tokens = len(data.prompt_ids[(plan.latency_sizes[0], False)])
        res.throughput.extend(ThroughputRow(name, c, tokens, outcome) for c in plan.concurrency)
        names = [name, OURS_LEAN] if name == OURS else [name]
        for row_name in names:
            res.stream_derender.extend(StreamRow(row_name, n, outcome) for n in plan.stream_n)
            for size in plan.bytes_prompts:
                tokens = len(data.prompt_ids[(size, True)])
                res.bytes_per_chunk.append(BytesRow(row_name, tokens, outcome))
        res.batch_derender.extend(BatchRow(name, n, outcome) for n in plan.stream_n)


def _show(outcome: Outcome, text: str) -> str:
    return text if outcome.ok else f"{outcome.status} ({outcome.note})"


def _secs(value: float | None) -> str:
    return "?" if value is None else f"~{value:.0f} s"


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


def _loadavg() -> str:
    """1, 5 and 15 minute load averages: other work on the machine shows up here."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _terminate(signum: int, frame: object) -> None:
    # Turn SIGTERM into the same unwinding as Ctrl-C, so the finally blocks stop the servers.
    raise KeyboardInterrupt(f"signal {signum}")


def compare(args: argparse.Namespace) -> int:
    say = Progress()
    plan = QUICK if args.quick else FULL
    if args.stream_budget:
        plan = msgspec.structs.replace(plan, stream_budget_s=args.stream_budget)
    model = Path(args.model).resolve()
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
    results.meta.load_average["start"] = _loadavg()
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
    results.meta.load_average["end"] = _loadavg()
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
    words = shlex.split(template.format(model=model, port=port, flags=shlex.join(flags)))
    return words


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cmp = sub.add_parser("compare", help="measure render-service and vLLM 0.33.0 side by side")
    cmp.add_argument("--quick", action="store_true", help="small bounded run (< 3 minutes)")
    cmp.add_argument(
        "--model",
        default=str(DEFAULT_MODEL),
        help="HF model directory (default: ../shared/models/qwen3)",
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
        help="wall-time cap in s for one streaming-derender run (default: 75 quick, 600 full)",
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
