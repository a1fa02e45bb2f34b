"""Sustained load on a 2-worker server: renders (1k-32k tokens, some with tools) beside 256
concurrent streaming derenders, for --duration seconds, with hostile clients alongside: slowloris
connections that never finish their headers and clients sending oversized or too many headers.
Not a test: run it by hand.

    PYTHONPATH=. python bench/load.py --duration 600

It starts the server itself (qwen3, --reasoning-parser qwen3, hermes tools, a shared state secret so
chunks may land on either worker process), drives it with one light httpx-async client, samples
the RSS of every server process from /proc, and writes bench/results/<UTC date>-load.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / ".." / "shared" / "models" / "qwen3"
FLAGS = ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    }
]
STREAM_CHAT = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS}
# A typical qwen3 answer: reasoning, prose, then one hermes tool call, then <|im_end|>.
OUTPUT_TEXT = (
    "<think>\nThe user asks about the weather in Paris. I should call the weather tool with the "
    "city name and the metric unit, then summarise. "
    * 6
    + "</think>\n\nLet me check the current weather for you.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call><|im_end|>'
)
PARAGRAPH = (
    "The render tier turns chat requests into token ids and generated ids back into responses. "
    "It must stay fast and bounded under sustained load, whatever the clients send. "
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc/*/stat."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        parents.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, []))
    return tree


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


class Recorder:
    """Latencies and errors of the well-behaved clients; what the hostile ones got, apart."""

    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = {}
        self.errors: Counter[str] = Counter()
        self.hostile: Counter[str] = Counter()
        self.streams_done = 0

    def ok(self, kind: str, seconds: float) -> None:
        self.latency.setdefault(kind, []).append(seconds)

    def error(self, kind: str, what: str) -> None:
        self.errors[f"{kind}: {what}"] += 1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed_post(
    client: httpx.AsyncClient, rec: Recorder, kind: str, path: str, body: dict[str, Any]
) -> dict[str, Any] | None:
    start = time.perf_counter()
    try:
        response = await client.post(path, json=body)
    except httpx.HTTPError as exc:
        rec.error(kind, type(exc).__name__)
        return None
    if response.status_code != 200:
        rec.error(kind, f"HTTP {response.status_code} {response.text[:120]}")
        return None
    rec.ok(kind, time.perf_counter() - start)
    return response.json()  # type: ignore[no-any-return]


async def render_worker(
    client: httpx.AsyncClient,
    rec: Recorder,
    stop: float,
    rng: random.Random,
    chars_per_token: float,
) -> None:
    while time.monotonic() < stop:
        tokens = int(rng.uniform(1000, 32000))
        text = PARAGRAPH * max(1, int(tokens * chars_per_token / len(PARAGRAPH)))
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "max_tokens": 64}
        with_tools = rng.random() < 0.3
        if with_tools:
            body["tools"] = TOOLS
        kind = "render 16k-32k" if tokens >= 16000 else "render 1k-16k"
        await timed_post(
            client,
            rec,
            kind + (" +tools" if with_tools else ""),
            "/v1/chat/completions/render",
            body,
        )


async def stream_worker(
    client: httpx.AsyncClient,
    rec: Recorder,
    stop: float,
    rng: random.Random,
    prompt: list[int],
    output: list[int],
    index: int,
) -> None:
    stream_no = 0
    while time.monotonic() < stop:
        stream_no += 1
        request_id = f"generate-tokens-chatcmpl-load-{index}-{stream_no}"
        state: Any = None
        position = 0
        names = ""
        failed = False
        while position < len(output):
            if time.monotonic() >= stop:  # abandon the stream: the run is over
                return
            size = rng.randint(1, 8)
            ids = output[position : position + size]
            position += size
            last = position >= len(output)
            body: dict[str, Any] = {
                "stream": True,
                "stream_state": state,
                "generate_chunk": {
                    "request_id": request_id,
                    "choices": [
                        {"index": 0, "finish_reason": "stop" if last else None, "token_ids": ids}
                    ],
                },
            }
            if state is None:  # the lean protocol: only the first chunk carries the request
                body["prompt_token_ids"] = prompt
                body["chat_request"] = {**STREAM_CHAT, "stream": True}
            payload = await timed_post(
                client, rec, "derender chunk", "/v1/chat/completions/derender", body
            )
            if payload is None:
                failed = True
                break
            state = payload["stream_state"]
            for call in payload["chunk"]["choices"][0]["delta"].get("tool_calls") or []:
                names += call["function"].get("name") or ""
        if not failed:
            if names != "get_weather":
                rec.error("stream", f"wrong tool call name {names!r}")
            rec.streams_done += 1


async def slowloris_worker(host: str, port: int, rec: Recorder, stop: float) -> None:
    """One connection at a time that sends a header line a second and never ends its headers;
    the server must close it (--header-timeout), and the client then opens the next."""
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            rec.hostile[f"slowloris: connect {type(exc).__name__}"] += 1
            await asyncio.sleep(1)
            continue
        opened = time.monotonic()
        outcome = "still open at the end"
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            while time.monotonic() < stop:
                writer.write(b"X-Slow: 1\r\n")
                await writer.drain()
                try:
                    answer = await asyncio.wait_for(reader.read(200), 1.0)
                except TimeoutError:
                    continue
                status = answer[9:12].decode(errors="replace") if answer else "closed"
                outcome = f"answered {status}" if answer else "closed without answer"
                break
        except OSError as exc:
            outcome = f"reset ({type(exc).__name__})"
        finally:
            writer.close()
        rec.hostile[f"slowloris: {outcome}"] += 1
        if outcome != "still open at the end":
            rec.ok("slowloris connection lifetime", time.monotonic() - opened)


async def big_header_worker(
    host: str, port: int, rec: Recorder, stop: float, rng: random.Random
) -> None:
    """Requests with a 1-16 MB header, or 20,000 headers, one after another: each must get 431."""
    while time.monotonic() < stop:
        if rng.random() < 0.5:
            headers = b"X-Big: " + b"a" * rng.randint(1 << 20, 16 << 20) + b"\r\n"
            kind = "oversized header"
        else:
            headers = b"".join(b"X-H%d: v\r\n" % i for i in range(20_000))
            kind = "20,000 headers"
        request = b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"Connection: close\r\n\r\n"
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as exc:
            rec.hostile[f"{kind}: connect {type(exc).__name__}"] += 1
            await asyncio.sleep(1)
            continue
        try:
            writer.write(request)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(200), 30)
            status = answer[9:12].decode(errors="replace") if answer else "closed"
            rec.hostile[f"{kind}: {status}"] += 1
        except (OSError, TimeoutError) as exc:
            rec.hostile[f"{kind}: {type(exc).__name__}"] += 1
        finally:
            writer.close()
        await asyncio.sleep(0.5)


async def cache_bytes(client: httpx.AsyncClient) -> int:
    """The server's cache sizes from /metrics (``render_service_cache_bytes``, all caches), or -1."""
    try:
        text = (await client.get("/metrics")).text
    except httpx.HTTPError:
        return -1
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("render_service_cache_bytes{")
    )


async def sample_rss(
    root: int,
    stop: float,
    samples: list[tuple[float, int, int, float, int]],
    client: httpx.AsyncClient,
) -> None:
    """Every 5 s: the server's processes, their RSS, the machine's 1-minute load average, and
    the caches' bytes as /metrics reports them (bounded by the cache budgets)."""
    start = time.monotonic()
    while time.monotonic() < stop:
        pids = process_tree(root)
        t, rss, load = round(time.monotonic() - start, 1), rss_bytes(pids), os.getloadavg()[0]
        samples.append((t, len(pids), rss, load, await cache_bytes(client)))
        await asyncio.sleep(5)


async def drive(url: str, root: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    # Drop idle connections before uvicorn's 5 s keep-alive timeout does: otherwise a request can
    # go out on a connection the server is closing at that moment (a client-side ReadError).
    limits = httpx.Limits(max_connections=args.streams + args.renders + 8, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        rendered = (await client.post("/v1/chat/completions/render", json=STREAM_CHAT)).json()
        prompt = rendered["token_ids"]
        output = (
            await client.post(
                "/tokenize", json={"prompt": OUTPUT_TEXT, "add_special_tokens": False}
            )
        ).json()["tokens"]
        probe = (await client.post("/tokenize", json={"prompt": PARAGRAPH * 40})).json()["count"]
        chars_per_token = len(PARAGRAPH * 40) / probe
        rec = Recorder()
        samples: list[tuple[float, int, int, float, int]] = []
        started = time.monotonic()
        stop = started + args.duration
        tasks = [asyncio.create_task(sample_rss(root, stop, samples, client))]
        tasks += [
            asyncio.create_task(
                render_worker(client, rec, stop, random.Random(rng.random()), chars_per_token)
            )
            for _ in range(args.renders)
        ]
        tasks += [
            asyncio.create_task(
                stream_worker(client, rec, stop, random.Random(rng.random()), prompt, output, i)
            )
            for i in range(args.streams)
        ]
        host, port = url.removeprefix("http://").split(":")
        tasks += [
            asyncio.create_task(slowloris_worker(host, int(port), rec, stop))
            for _ in range(args.slowloris)
        ]
        tasks += [
            asyncio.create_task(
                big_header_worker(host, int(port), rec, stop, random.Random(rng.random()))
            )
            for _ in range(args.big_headers)
        ]
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
    return {
        "duration_s": round(elapsed, 1),
        "output_tokens_per_stream": len(output),
        "prompt_tokens_per_stream": len(prompt),
        "streams_completed": rec.streams_done,
        "latency": {
            kind: {
                "count": len(v),
                "p50_ms": round(statistics.median(v) * 1000, 1),
                "p99_ms": round(percentile(v, 0.99) * 1000, 1),
                "max_ms": round(max(v) * 1000, 1),
                "per_s": round(len(v) / elapsed, 1),
            }
            for kind, v in sorted(rec.latency.items())
        },
        "errors": dict(rec.errors),
        "hostile": dict(rec.hostile),
        "rss": [
            {
                "t_s": t,
                "processes": n,
                "rss_mb": round(b / 2**20, 1),
                "load1": round(load, 2),
                "cache_mb": round(c / 2**20, 1) if c >= 0 else None,
            }
            for t, n, b, load, c in samples
        ],
        "load_average": (
            f"min {min(s[3] for s in samples):.1f}, median {statistics.median(s[3] for s in samples):.1f}, max {max(s[3] for s in samples):.1f}"
            if samples
            else ""
        ),
    }


def start_server(args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable, "-m", "render_service", "serve", str(args.model), *FLAGS,
        "--workers", str(args.workers), "--host", "127.0.0.1", "--port", str(port),
        "--state-secret", "load-test-secret-0123456789abcdef", "--log-level", "warning",
        *args.server_flag,
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit("server did not become healthy")


def write_report(result: dict[str, Any], args: argparse.Namespace) -> Path:
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{dt.datetime.now(dt.UTC):%Y-%m-%d}-load"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    rss = result["rss"]
    warm = [s for s in rss if s["t_s"] >= min(60.0, result["duration_s"] / 4)]
    lines = [
        f"# Load test, {result['started_utc']}",
        "",
        f"Command: `PYTHONPATH=. python bench/load.py --duration {args.duration} "
        f"--streams {args.streams} --renders {args.renders} --workers {args.workers} "
        f"--slowloris {args.slowloris} --big-headers {args.big_headers}"
        + "".join(f" --server-flag={flag}" for flag in args.server_flag)
        + "`",
        "",
        f"Server: qwen3 ({' '.join(FLAGS)}), {args.workers} worker processes, on a 2-core machine "
        "shared with other jobs; the load client runs on the same cores.",
        f"Covers {result['duration_s']} s. Each stream: {result['prompt_tokens_per_stream']} prompt "
        f"tokens, {result['output_tokens_per_stream']} output tokens in chunks of 1-8 ids "
        f"(lean protocol); {result['streams_completed']} streams completed.",
        "",
        "| operation | count | per s | p50 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, s in result["latency"].items():
        lines.append(
            f"| {kind} | {s['count']} | {s['per_s']} | {s['p50_ms']} | {s['p99_ms']} | {s['max_ms']} |"
        )
    total_errors = sum(result["errors"].values())
    lines += ["", f"Errors of the well-behaved clients: {total_errors}"]
    lines += [f"- {k}: {v}" for k, v in sorted(result["errors"].items())]
    lines += [
        "",
        f"Hostile clients alongside ({args.slowloris} slowloris connections, {args.big_headers} "
        "oversized-header clients), what they got:",
    ]
    lines += [f"- {k}: {v}" for k, v in sorted(result["hostile"].items())]
    if result.get("load_average"):
        lines += ["", f"Load average (1 min) during the run: {result['load_average']}"]
    if warm:
        mbs = [s["rss_mb"] for s in warm]
        lines += [
            "",
            f"RSS (sum over {warm[-1]['processes']} server processes) after warm-up: "
            f"first {mbs[0]} MB, min {min(mbs)} MB, max {max(mbs)} MB, last {mbs[-1]} MB.",
        ]
    lines += [
        "",
        "Caches MB: `render_service_cache_bytes` from /metrics, summed over caches and worker "
        "processes (the caches' own estimate of the memory they hold).",
        "",
        "| t (s) | processes | RSS MB | caches MB | load (1 min) |",
        "|---:|---:|---:|---:|---:|",
    ]
    step = max(1, len(rss) // 20)
    for s in rss[::step] + ([rss[-1]] if rss and (len(rss) - 1) % step else []):
        lines.append(
            f"| {s['t_s']} | {s['processes']} | {s['rss_mb']} | {s.get('cache_mb', '')} "
            f"| {s.get('load1', '')} |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem.with_suffix(".md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--streams", type=int, default=256, help="concurrent streaming derenders")
    parser.add_argument("--renders", type=int, default=4, help="concurrent render clients")
    parser.add_argument("--workers", type=int, default=2, help="server processes")
    parser.add_argument("--slowloris", type=int, default=16, help="slowloris connections")
    parser.add_argument(
        "--big-headers", type=int, default=2, help="clients sending oversized or too many headers"
    )
    parser.add_argument(
        "--server-flag",
        action="append",
        default=[],
        help="one more server argument (repeat it), e.g. --server-flag=--segment-cache-bytes=8388608",
    )
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not args.model.is_dir():
        raise SystemExit(f"no model at {args.model}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = REPO / "bench" / "results" / "load-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    server = start_server(args, port, log)
    try:
        wait_healthy(url, server, log)
        started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        result = asyncio.run(drive(url, server.pid, args))
        result["started_utc"] = started
        result["server_alive_at_end"] = server.poll() is None
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
    print(write_report(result, args).read_text())


if __name__ == "__main__":
    main()
