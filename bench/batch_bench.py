"""``render-service batch render`` against vLLM's render server at full concurrency, one run.

    PYTHONPATH=. .venv/bin/python bench/batch_bench.py [--lines 4000] [--runs 3] [--clients 64]

One JSONL of ``--lines`` distinct ~1k-token Qwen3 chat requests (each its own system prompt,
tools, reasoning, tool calls and tool results: the library bench's generator), rendered by:

- ``render-service batch render IN OUT --workers 1`` and ``--workers 2`` (a fresh process each
  run, model load included);
- vLLM 0.33.0's render server (``vllm launch render``, started once, warmed up), every line
  posted to ``/v1/chat/completions/render`` from ``--clients`` concurrent keep-alive connections.

Runs alternate (workers 1, workers 2, vLLM) ``--runs`` times; the table gives medians. For a
batch run: wall time and lines/s end to end, lines/s and cores busy after its first output line
(the steady state, model load excluded), and cores busy over the whole run (user + sys of the
process tree / wall). For vLLM: lines/s, the server's cores busy and the client's. Every line's
``token_ids`` must be equal in vLLM's answer and in both batch outputs; the table says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from bench import loadgen, peer
from bench.cli import PARSER_FLAGS
from bench.library_bench import MODELS, REPO, _openai_messages, conversation
from bench.servers import (
    Server,
    free_port,
    load_average,
    process_cpu_seconds,
    tree_cpu_seconds,
)

RENDER = "/v1/chat/completions/render"


class _Ids(msgspec.Struct):
    token_ids: list[int]


class _Answer(msgspec.Struct):
    line: int
    result: _Ids | None = None


def write_requests(path: Path, lines: int, seed: int) -> None:
    """``lines`` distinct chat render bodies of about 1k tokens."""
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(lines):
            conv = conversation(rng, 1000, single_call=False)
            body = {"messages": _openai_messages(conv), "tools": conv["tools"]}
            f.write(json.dumps(body) + "\n")


def _count_lines(path: Path, seen: tuple[int, int]) -> tuple[int, int]:
    """(lines, bytes read) of ``path`` after reading on from ``seen``."""
    count, offset = seen
    try:
        with path.open("rb") as f:
            f.seek(offset)
            block = f.read()
    except FileNotFoundError:
        return seen
    return count + block.count(b"\n"), offset + len(block)


def _cpu(pid: int) -> tuple[float, float]:
    return tree_cpu_seconds(pid), process_cpu_seconds(pid)


def batch_command(model: Path, source: Path, target: Path, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "render_service", "batch", "render", str(source), str(target),
        "--model", str(model), *PARSER_FLAGS, *flags,
    ]  # fmt: skip


def watch(
    command: list[str], target: Path, lines: int, interrupt_at: int | None = None
) -> dict[str, Any]:
    """Run one batch command and watch its output grow until it holds ``lines`` lines (or, with
    ``interrupt_at``, Ctrl-C its process group once it holds that many)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    errors = target.with_suffix(".stderr")
    seen = _count_lines(target, (0, 0))
    before = seen[0]
    start = time.perf_counter()
    with errors.open("wb") as stderr:
        process = subprocess.Popen(command, env=env, stderr=stderr, start_new_session=True)
    # (time, lines, CPU seconds of the tree, of the parent alone) at the first new output line
    first: tuple[float, int, float, float] | None = None
    last: tuple[float, int, float, float] | None = None  # the same when the last line is out
    # os.wait4, not Popen.poll: it reaps the run with the CPU time of its whole process tree.
    while (waited := os.wait4(process.pid, os.WNOHANG))[0] == 0:
        time.sleep(0.02)
        seen = _count_lines(target, seen)
        now = time.perf_counter()
        if first is None and seen[0] > before:
            first = (now, seen[0], *_cpu(process.pid))
        if last is None and seen[0] >= (interrupt_at or lines):
            last = (now, seen[0], *_cpu(process.pid))
            if interrupt_at is not None:
                os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(waited[1])
    usage = waited[2]
    stderr_text = errors.read_text(errors="replace")
    if code != 0 and interrupt_at is None:
        raise SystemExit(f"batch run failed ({code}): {stderr_text[-500:]}")
    seen = _count_lines(target, seen)
    row: dict[str, Any] = {
        "exit_code": code,
        "new_lines": seen[0] - before,
        "wall_s": wall,
        "lines_per_s": (seen[0] - before) / wall,
        "cores": (usage.ru_utime + usage.ru_stime) / wall,
        # tqdm redraws its bar with \r: the last drawing is the bar at the end of the run
        "progress": stderr_text.replace("\r", "\n").strip().splitlines()[-3:],
    }
    if first is not None and last is not None and last[0] > first[0]:
        steady = last[0] - first[0]
        row["steady_lines_per_s"] = (last[1] - first[1]) / steady
        row["steady_cores"] = (last[2] - first[2]) / steady
        row["steady_parent_cores"] = (last[3] - first[3]) / steady
        row["per_cpu"] = (last[1] - first[1]) / max(last[2] - first[2], 1e-9)
    return row


def run_batch(model: Path, source: Path, target: Path, workers: int, lines: int) -> dict[str, Any]:
    """One ``render-service batch render`` run from scratch, watched from outside."""
    target.unlink(missing_ok=True)
    flags = ("--workers", str(workers), "--no-progress")
    return watch(batch_command(model, source, target, *flags), target, lines)


# The 1% of malformed lines of the demonstration: bad JSON, a body vLLM would refuse, bytes that
# are not UTF-8, an empty line.
MALFORMED = (
    b'{"messages": [ not json',
    b'{"messages": []}',
    b'{"messages": "hello", "tools": 3}',
    b"\xff\xfe not utf-8",
    b"",
)


class _Line(msgspec.Struct):
    line: int
    result: msgspec.Raw = msgspec.Raw()
    error: msgspec.Raw = msgspec.Raw()


def write_demo(path: Path, lines: int, seed: int) -> set[int]:
    """``lines`` distinct requests, every line numbered ``100k + 50`` malformed: their numbers."""
    rng = random.Random(seed)
    broken = set()
    with path.open("wb") as f:
        for n in range(1, lines + 1):
            if n % 100 == 50:
                broken.add(n)
                f.write(MALFORMED[(n // 100) % len(MALFORMED)] + b"\n")
                continue
            conv = conversation(rng, 1000, single_call=False)
            body = {"messages": _openai_messages(conv), "tools": conv["tools"]}
            f.write(msgspec.json.encode(body) + b"\n")
    return broken


def check_demo(target: Path, lines: int, broken: set[int]) -> str:
    """Whether OUT answers every line once, in order, errors exactly on the malformed lines."""
    decoder = msgspec.json.Decoder(_Line)
    expected = 1
    with target.open("rb") as f:
        for raw in f:
            answer = decoder.decode(raw)
            if answer.line != expected:
                return f"NO: line {answer.line} where {expected} was due"
            if (len(answer.error) > 0) != (answer.line in broken) or (len(answer.result) > 0) == (
                answer.line in broken
            ):
                return f"NO: line {answer.line} answered wrongly"
            expected += 1
    if expected != lines + 1:
        return f"NO: {expected - 1} of {lines} lines answered"
    return f"yes: {lines} lines in order, each once, errors on exactly the {len(broken)} malformed"


def demo(args: argparse.Namespace, model: Path) -> None:
    """A big file through ``batch render`` with its progress bar, Ctrl-C at 40%, ``--resume``."""
    work = Path(tempfile.mkdtemp(prefix="batch-demo-"))
    source, target = work / "requests.jsonl", work / "out.jsonl"
    broken = write_demo(source, args.demo, args.seed)
    size = source.stat().st_size
    print(f"{args.demo} lines ({size / 1e6:.0f} MB, {len(broken)} malformed) in {source}")
    workers = ("--workers", str(args.workers)) if args.workers else ()
    parts = {}
    load = {"start": load_average()}
    command = batch_command(model, source, target, *workers)
    parts["run, Ctrl-C at 40%"] = watch(command, target, args.demo, interrupt_at=args.demo * 2 // 5)
    load["after the first part"] = load_average()
    parts["--resume"] = watch([*command, "--resume"], target, args.demo)
    load["end"] = load_average()
    print(f"load average (1/5/15 min): {load}")
    print(f"output check: {check_demo(target, args.demo, broken)}\n")
    print("| part | exit | lines written | wall s | lines/s | cores busy | steady lines/s "
          "| steady cores busy (parent) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, row in parts.items():
        print(
            f"| {name} | {row['exit_code']} | {row['new_lines']:,} | {row['wall_s']:.1f} "
            f"| {row['lines_per_s']:,.0f} | {row['cores']:.2f} "
            f"| {_cell(row.get('steady_lines_per_s'))} | {_cell(row.get('steady_cores'), 2)} "
            f"({_cell(row.get('steady_parent_cores'), 2)}) |"
        )
    for name, row in parts.items():
        print(f"\n{name}, the end of its stderr:")
        for line in row["progress"]:
            print(f"    {line}")


def read_ids(target: Path) -> list[list[int] | None]:
    decoder = msgspec.json.Decoder(_Answer)
    with target.open("rb") as f:
        answers = [decoder.decode(line) for line in f]
    return [a.result.token_ids if a.result else None for a in answers]


async def _drive(base_url: str, bodies: list[bytes], clients: int) -> tuple[list[bytes], float]:
    connections = [await loadgen.Connection.open(base_url) for _ in range(clients)]
    answers: list[bytes] = [b""] * len(bodies)
    todo = iter(range(len(bodies)))

    async def loop(conn: loadgen.Connection) -> None:
        for i in todo:
            status, answer = await conn.send(loadgen.post_request(base_url, RENDER, bodies[i]))
            if status != 200:
                raise RuntimeError(f"line {i + 1}: HTTP {status}: {answer[:200]!r}")
            answers[i] = answer

    try:
        start = time.perf_counter()
        await asyncio.gather(*(loop(conn) for conn in connections))
        elapsed = time.perf_counter() - start
    finally:
        for conn in connections:
            await conn.close()
    return answers, elapsed


def run_vllm(server: Server, bodies: list[bytes], clients: int) -> tuple[dict[str, Any], list[Any]]:
    cpu0, own0 = server.cpu_seconds(), time.process_time()
    answers, wall = asyncio.run(_drive(server.base_url, bodies, clients))
    cpu, own = server.cpu_seconds() - cpu0, time.process_time() - own0
    decoder = msgspec.json.Decoder(_Ids)
    ids = [decoder.decode(a).token_ids for a in answers]
    row = {
        "wall_s": wall,
        "lines_per_s": len(bodies) / wall,
        "cores": cpu / wall,
        "client_cores": own / wall,
        "per_cpu": len(bodies) / max(cpu, 1e-9),
    }
    return row, ids


def start_vllm(args: argparse.Namespace, model: Path) -> Server:
    venv = peer.venv_dir(args.vllm_venv)
    peer.ensure_installed(venv)
    port = free_port()
    server = Server(
        "vLLM 0.33.0",
        peer.server_command(venv, Path(model.name), port, PARSER_FLAGS),
        peer.server_env(),
        model.parent,  # the served model name is the directory name
        port,
        REPO / "bench" / ".work" / "logs" / "batch-vllm.log",
    )
    try:
        server.wait_healthy(180.0)
    except BaseException:
        server.stop()
        raise
    return server


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if key in r]
    return statistics.median(values) if values else None


def _cell(value: float | None, digits: int = 0) -> str:
    return "" if value is None else f"{value:,.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--model", default=str(MODELS / "qwen3"))
    parser.add_argument("--vllm-venv", default=None)
    parser.add_argument("--seed", type=int, default=21)
    parser.add_argument(
        "--demo", type=int, default=0, help="instead: the LINES-line run with 1%% malformed lines"
    )
    parser.add_argument("--workers", type=int, default=0, help="--demo's workers (default: all)")
    args = parser.parse_args()
    model = Path(args.model).resolve()
    if args.demo:
        demo(args, model)
        return
    work = Path(tempfile.mkdtemp(prefix="batch-bench-"))
    source = work / "requests.jsonl"
    write_requests(source, args.lines, args.seed)
    bodies = source.read_bytes().splitlines()
    print(f"{args.lines} requests in {source}; load average {load_average()}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"workers 1": [], "workers 2": [], "vLLM": []}
    loads = [load_average()]
    server = start_vllm(args, model)
    try:
        asyncio.run(_drive(server.base_url, bodies[: 2 * args.clients], args.clients))  # warm-up
        outputs: dict[str, list[list[int] | None]] = {}
        for r in range(args.runs):
            for workers in (1, 2):
                name = f"workers {workers}"
                target = work / f"out-{workers}.jsonl"
                row = run_batch(model, source, target, workers, args.lines)
                runs[name].append(row)
                outputs[name] = read_ids(target)
                row.pop("progress")
                print(f"run {r + 1}: {name}: {json.dumps(row)}", flush=True)
            row, vllm_ids = run_vllm(server, bodies, args.clients)
            runs["vLLM"].append(row)
            print(f"run {r + 1}: vLLM x{args.clients}: {json.dumps(row)}", flush=True)
            loads.append(load_average())
    finally:
        server.stop()
    equal = {
        name: sum(a == b for a, b in zip(ids, vllm_ids, strict=True))
        for name, ids in outputs.items()
    }
    vllm_rate = _median(runs["vLLM"], "lines_per_s") or 0.0
    print(f"\nload average (1/5/15 min) at start and after each round: {' | '.join(loads)}")
    print(f"{args.lines} lines of ~1k-token Qwen3 chats, medians of {args.runs} alternated runs\n")
    print(
        "| system | wall s | lines/s | ratio to vLLM | cores busy (whole run) "
        "| steady lines/s | steady cores busy (parent) | lines per CPU-second | ids = vLLM |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rows in runs.items():
        rate = _median(rows, "lines_per_s") or 0.0
        label = f"vLLM render server, {args.clients} clients" if name == "vLLM" else name
        busy = _cell(_median(rows, "cores"), 2)
        if name == "vLLM":
            busy += f" (+ client {_cell(_median(rows, 'client_cores'), 2)})"
        parent = _cell(_median(rows, "steady_parent_cores"), 2)
        parent = f" ({parent})" if parent else ""
        same = "—" if name == "vLLM" else f"{equal[name]}/{args.lines}"
        print(
            f"| {label} | {_cell(_median(rows, 'wall_s'), 1)} | {rate:,.0f} "
            f"| {rate / vllm_rate:.2f}x | {busy} | {_cell(_median(rows, 'steady_lines_per_s'))} "
            f"| {_cell(_median(rows, 'steady_cores'), 2)}{parent} | {_cell(_median(rows, 'per_cpu'))} "
            f"| {same} |"
        )
    steady = _median(runs["workers 2"], "steady_lines_per_s")
    if steady:
        print(f"\nworkers 2, steady state / vLLM: {steady / vllm_rate:.2f}x")


if __name__ == "__main__":
    main()
