"""Image render benchmark: latency and throughput with 1 and 4 images of 1280x720 per request,
and text-only render latency alone vs while image requests are in flight.

Every request carries fresh images (a different seed per image), so neither server can answer
from a processor cache. Images are JPEG data URLs, as clients usually send them. Request bodies
are encoded before the clock starts and responses are read but not parsed, so the client's own
JSON work stays out of the latencies; the text probe under load runs in a process of its own.
The peer (vLLM 0.33.0's ``vllm launch render``, from bench's own venv, installed on first use
with torchvision's transforms added: ``peer.ensure_vision``) is measured the same way. Both
servers stay up while rounds alternate between them; the report goes to
bench/results/<date>-images.md. From the repo root:

    PYTHONPATH=. python bench/mm_bench.py [--rounds 3] [--requests 20] [--no-peer]
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from bench import peer

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / ".." / "shared" / "models"
CHAT = "/v1/chat/completions/render"
JSON = {"content-type": "application/json"}
TEXT = {"messages": [{"role": "user", "content": "Summarise the plot of Hamlet in two sentences."}]}


def photo_like(seed: int, width: int = 1280, height: int = 720) -> str:
    """A JPEG data URL: smooth gradients plus mild noise (compresses like a photo)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.uniform(0, 6.28, 3)
    channels = [
        127 + 100 * np.sin(x / (90 + 30 * i) + y / (70 + 20 * i) + phase[i]) for i in range(3)
    ]
    pixels = np.stack(channels, axis=-1) + rng.normal(0, 6, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=88)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def image_request(urls: list[str]) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    content.append({"type": "text", "text": "What is in these pictures?"})
    return {"messages": [{"role": "user", "content": content}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(cmd: list[str], port: int, env: dict[str, str], cwd: Path) -> Iterator[tuple[str, int]]:
    (REPO / "bench" / ".work").mkdir(exist_ok=True)
    log = open(REPO / "bench" / ".work" / f"mm-server-{port}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
        cwd=cwd,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited: see {log.name}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy: see {log.name}")
            time.sleep(0.3)
        yield url, process.pid
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def session_cpu(session: int) -> float:
    """CPU seconds used so far by every live process of a session (server + its workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == session:
            total += int(fields[11]) + int(fields[12])
    return total / tick


def timed_post(client: httpx.Client, body: bytes) -> float:
    """Seconds from sending a pre-encoded body to the last response byte (read, not parsed)."""
    start = time.perf_counter()
    with client.stream("POST", CHAT, content=body, headers=JSON) as response:
        size = sum(len(chunk) for chunk in response.iter_raw())
        elapsed = time.perf_counter() - start
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code} after {size} bytes")
    return elapsed


def encoded(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def image_bodies(count: int, requests: int, seeds: Iterator[int]) -> list[bytes]:
    return [
        encoded(image_request([photo_like(next(seeds)) for _ in range(count)]))
        for _ in range(requests)
    ]


def text_probe(url: str, start: Any, stop: Any, results: Any) -> None:
    """Text renders back to back until ``stop``: its own process, so the image clients'
    GIL never delays its timings."""
    body = encoded(TEXT)
    times = []
    with httpx.Client(base_url=url, timeout=120) as client:
        start.wait()
        while not stop.is_set():
            times.append(timed_post(client, body))
    results.put(times)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def warm_up(url: str, images: int, seeds: Iterator[int]) -> None:
    """Fresh images until the server is in its steady state: a processor cache that is on
    (vLLM's is, by default) past its fill phase, where every image touches new memory."""
    bodies = image_bodies(4, -(-images // 4), seeds)
    with ThreadPoolExecutor(4) as pool, httpx.Client(base_url=url, timeout=300) as client:
        list(pool.map(lambda body: timed_post(client, body), bodies))


def run_server(
    url: str, session: int, args: argparse.Namespace, seeds: Iterator[int]
) -> dict[str, Any]:
    out: dict[str, Any] = {"concurrency": args.concurrency}
    text = encoded(TEXT)
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(5):
            timed_post(client, text)
        timed_post(client, image_bodies(1, 1, seeds)[0])
        out["text_alone"] = [timed_post(client, text) for _ in range(args.text_requests)]
        for count in (1, 4):
            bodies = image_bodies(count, args.requests, seeds)
            cpu = session_cpu(session)
            out[f"serial_{count}"] = [timed_post(client, b) for b in bodies]
            out[f"cpu_{count}"] = (session_cpu(session) - cpu) / len(bodies)
            bodies = image_bodies(count, args.requests, seeds)
            clients = [httpx.Client(base_url=url, timeout=300) for _ in range(args.concurrency)]
            start = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                jobs = [
                    pool.submit(timed_post, clients[i % args.concurrency], b)
                    for i, b in enumerate(bodies)
                ]
                out[f"concurrent_{count}"] = [j.result() for j in jobs]
            out[f"throughput_{count}"] = len(bodies) / (time.perf_counter() - start)
            for c in clients:
                c.close()
    # Text renders while 4-image requests keep the server busy.
    bodies = image_bodies(4, args.requests, seeds)
    context = multiprocessing.get_context("spawn")
    started, stop, results = context.Event(), context.Event(), context.Queue()
    probe = context.Process(target=text_probe, args=(url, started, stop, results))
    probe.start()
    clients = [httpx.Client(base_url=url, timeout=300) for _ in range(args.concurrency)]
    with ThreadPoolExecutor(args.concurrency, initializer=_quiet_load_thread) as pool:
        started.set()
        list(pool.map(timed_post, [clients[i % len(clients)] for i in range(len(bodies))], bodies))
    stop.set()
    out["text_busy"] = results.get(timeout=120)
    probe.join()
    for c in clients:
        c.close()
    return out


def _quiet_load_thread() -> None:
    """The busy phase's image clients run at low CPU priority (Linux: per thread): reading
    30 MB responses in Python is client work that would otherwise delay the text probe too."""
    if sys.platform == "linux":
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


ROWS = ("text_alone", "text_busy", "serial_1", "serial_4", "concurrent_1", "concurrent_4")


def report(name: str, result: dict[str, Any]) -> list[str]:
    lines = [f"## {name}", "", "| measurement | p50 ms | p90 ms | p99 ms | n |"]
    lines.append("|---|---:|---:|---:|---:|")
    for key in ROWS:
        values = result[key]
        lines.append(
            f"| {key} | {pct(values, 0.5):.1f} | {pct(values, 0.9):.1f} | {pct(values, 0.99):.1f} "
            f"| {len(values)} |"
        )
    lines.append("")
    for count in (1, 4):
        lines.append(
            f"- {count} image(s)/request: throughput {result[f'throughput_{count}']:.2f} req/s at "
            f"concurrency {result['concurrency']}, server CPU "
            f"{result[f'cpu_{count}'] * 1000:.0f} ms per request (serial phase)"
        )
    lines.append(
        f"- text mean alone {statistics.mean(result['text_alone']) * 1000:.1f} ms, "
        f"while images load {statistics.mean(result['text_busy']) * 1000:.1f} ms"
    )
    return [*lines, ""]


def comparison(ours: dict[str, Any], peer: dict[str, Any]) -> list[str]:
    """Ours over vLLM's: below 1 is better for latency and CPU, above 1 for throughput."""
    lines = ["## Side by side", "", "| measurement | vLLM 0.33.0 | render-service | ratio |"]
    lines.append("|---|---:|---:|---:|")
    for key in ROWS:
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            a, b = pct(peer[key], q), pct(ours[key], q)
            lines.append(f"| {key} {label} ms | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    for count in (1, 4):
        a, b = peer[f"throughput_{count}"], ours[f"throughput_{count}"]
        lines.append(f"| throughput, {count} image(s) req/s | {a:.2f} | {b:.2f} | {b / a:.2f} |")
        a, b = peer[f"cpu_{count}"] * 1000, ours[f"cpu_{count}"] * 1000
        lines.append(
            f"| server CPU/request, {count} image(s) ms | {a:.0f} | {b:.0f} | {b / a:.2f} |"
        )
    return [*lines, ""]


def merged(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Latency samples pooled over the rounds; throughput and CPU their median."""
    out: dict[str, Any] = {"concurrency": rounds[0]["concurrency"]}
    for key in ROWS:
        out[key] = [value for r in rounds for value in r[key]]
    for count in (1, 4):
        for key in (f"throughput_{count}", f"cpu_{count}"):
            out[key] = statistics.median(r[key] for r in rounds)
    return out


def spread(name: str, rounds: list[dict[str, Any]]) -> str:
    p50s = ", ".join(
        f"{key} {min(pct(r[key], 0.5) for r in rounds):.1f}-{max(pct(r[key], 0.5) for r in rounds):.1f}"
        for key in ROWS
    )
    return f"- {name}, p50 ms per round (lowest-highest): {p50s}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-vl", help="directory name under shared/models")
    parser.add_argument("--requests", type=int, default=20, help="requests per row and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--text-requests", type=int, default=50)
    parser.add_argument("--warm-images", type=int, default=800, help="sent before measuring")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--media-num-workers", type=int, default=2)
    parser.add_argument("--media-executor", choices=["process", "thread"], default="thread")
    parser.add_argument("--peer-venv", default=None, help="the peer's venv (default: bench's)")
    parser.add_argument("--no-peer", action="store_true", help="measure render-service only")
    parser.add_argument("--out", default=None, help="report path (default: bench/results/)")
    args = parser.parse_args()
    seeds = iter(range(10**9))
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    names = ["render-service"] if args.no_peer else ["render-service", "vLLM 0.33.0 launch render"]
    ports = [free_port() for _ in names]
    commands = [
        [
            sys.executable,
            "-m",
            "render_service",
            "serve",
            args.model,
            "--port",
            str(ports[0]),
            "--workers",
            "1",
            "--media-num-workers",
            str(args.media_num_workers),
            "--media-executor",
            args.media_executor,
        ]
    ]
    envs = [{"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}]
    if not args.no_peer:
        venv = peer.venv_dir(args.peer_venv)
        peer.ensure_installed(venv)
        peer.ensure_vision(venv)
        commands.append(peer.server_command(venv, Path(args.model), ports[1], []))
        envs.append({"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"})
    rounds: list[list[dict[str, Any]]] = [[] for _ in names]
    with contextlib.ExitStack() as stack:
        running = [
            stack.enter_context(server(cmd, port, env, MODELS))
            for cmd, port, env in zip(commands, ports, envs, strict=True)
        ]
        for name, (url, _) in zip(names, running, strict=True):
            print(f"warm-up: {args.warm_images} images to {name}", flush=True)
            warm_up(url, args.warm_images, seeds)
        # Both servers stay up; rounds alternate which goes first, so drifting load on the
        # machine falls on both alike.
        for number in range(args.rounds):
            order = list(range(len(names)))
            if number % 2:
                order.reverse()
            for i in order:
                print(f"round {number + 1}/{args.rounds}: {names[i]}", flush=True)
                url, pid = running[i]
                rounds[i].append(run_server(url, pid, args, seeds))
    results = [merged(r) for r in rounds]
    lines = [
        "# Image render: " + " vs ".join(n.removesuffix(" launch render") for n in names),
        "",
        f"`PYTHONPATH=. python bench/mm_bench.py {' '.join(sys.argv[1:])}`, started {started}, "
        f"model {args.model}, {args.rounds} rounds of {args.requests} requests per row and server "
        f"after {args.warm_images} warm-up images each "
        f"(both servers up, rounds alternating which goes first; latencies pooled over the rounds, "
        f"throughput and CPU their median), 1280x720 JPEG images (a fresh image per request), "
        f"render-service with `--workers 1 --media-num-workers {args.media_num_workers} "
        f"--media-executor {args.media_executor}`. serial_N: one client, N images per request; "
        f"concurrent_N: {args.concurrency} clients; text_busy: text renders from a separate "
        f"process while {args.concurrency} clients (threads at nice 10) send 4-image requests.",
        "",
    ]
    if not args.no_peer:
        lines += comparison(results[0], results[1])
    lines += ["## Spread between rounds", ""]
    lines += [spread(name, r) for name, r in zip(names, rounds, strict=True)] + [""]
    for name, result in reversed(list(zip(names, results, strict=True))):
        lines += report(name, result)
    out = Path(args.out) if args.out else REPO / "bench" / "results" / f"{started[:10]}-images.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"report: {out}")


if __name__ == "__main__":
    main()
