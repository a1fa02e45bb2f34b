"""A/B of streaming derender server CPU per chunk: two render-service checkouts, one machine.

Starts one server per checkout (same model, parser flags and secret), then runs rounds that
alternate which server goes first; each round measures, per server, one single-stream loop with
vLLM's full bodies and one lean loop (n output ids, one per call), and one multi-stream run
(JSON and msgpack items, for each of ``--streams`` stream counts, enough steps for ``--chunks``
chunks). Prints the median
over rounds of server CPU per chunk, and the load average before and after. Run from the repo root:

    PYTHONPATH=. python bench/ab_stream.py --a /path/to/base/checkout --b . [--rounds 5]

``--n`` sets the single streams' length (any number of ids); ``--streams 0`` runs the single
streams only, ``--multi-only`` the multi-stream rows only (e.g. ``--streams 16,64,256
--multi-only --n 256``).

Each checkout's ``render_service`` is put first on the server's PYTHONPATH, so one interpreter
(this one) serves both.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import msgspec

from bench import loadgen, measure
from bench.plan import QUICK, Inputs
from bench.servers import Server, free_port, load_average

PARSER_FLAGS = ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice"]
PARSER_FLAGS += ["--tool-call-parser", "hermes"]


def start(name: str, checkout: Path, model: Path, secret: str) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "render_service", "serve", model.name, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), *PARSER_FLAGS, "--state-secret", secret]
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve())}
    log = Path("bench/.work/logs") / f"ab-{name}.log"
    return Server(name, cmd, env, model.parent, port, log)


def one_round(
    server: Server,
    data: Inputs,
    n: int,
    streams: tuple[int, ...],
    chunks: int,
    tag: str,
    single: bool = True,
) -> dict[str, float]:
    """Server CPU per chunk (µs) of each workload on ``server``; each multi-stream row runs
    enough steps for at least ``chunks`` chunks (none for a stream count of 0)."""
    base = data.stream_base(QUICK.latency_sizes[0])
    ids = data.outputs[n]
    out: dict[str, float] = {}
    with loadgen.Client(server.base_url, 600.0) as client:
        for lean in (False, True) if single else ():
            run = measure.stream_derender(
                client, server.cpu_seconds, base, ids, lean, 600.0, f"chatcmpl-ab-{tag}-{lean}"
            )
            if not run.outcome.ok:
                raise SystemExit(f"{server.name}: stream failed: {run.outcome}")
            out["single lean" if lean else "single full"] = 1e6 * run.server_cpu_s / run.calls
        for mode in ("json", "msgpack"):
            for count in streams:
                if not count:
                    continue
                steps = measure.multi_steps(count, chunks, len(ids))
                multi = measure.multi_stream(
                    client, server.cpu_seconds, base, ids, count, steps, mode, 600.0
                )
                if not multi.outcome.ok:
                    raise SystemExit(f"{server.name}: multi-stream failed: {multi.outcome}")
                out[f"multi {count} {mode}"] = 1e6 * multi.server_cpu_s / multi.chunks
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", required=True, help="checkout B (the change)")
    parser.add_argument("--model", default="../shared/models/qwen3")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=1024, help="output ids per single stream")
    parser.add_argument(
        "--streams", default="256", help="stream counts of the multi-stream rows (0: none)"
    )
    parser.add_argument(
        "--chunks", type=int, default=4096, help="chunks per multi-stream row (at least)"
    )
    parser.add_argument("--multi-only", action="store_true", help="skip the single-stream rows")
    args = parser.parse_args()
    streams = tuple(int(s) for s in args.streams.split(","))
    single = not args.multi_only
    model = Path(args.model).resolve()
    if args.n < 1:
        raise SystemExit("--n must be at least 1")
    data = Inputs(model, msgspec.structs.replace(QUICK, stream_n=(args.n,)))
    secret = secrets.token_hex(16)
    servers = {
        "A": start("A", Path(args.a), model, secret),
        "B": start("B", Path(args.b), model, secret),
    }
    results: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in servers}
    print(f"load average at start: {load_average()}", flush=True)
    try:
        for server in servers.values():
            server.wait_healthy(180.0)
        for name, server in servers.items():  # warm-up: parsers, caches, first imports
            warm = (16,) if any(streams) else ()
            one_round(server, data, args.n, warm, 32, f"warm-{name}", single)
        for r in range(args.rounds):
            order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
            for name in order:
                row = one_round(servers[name], data, args.n, streams, args.chunks, f"{r}", single)
                for key, value in row.items():
                    results[name][key].append(value)
                shown = ", ".join(f"{k} {v:.0f}" for k, v in row.items())
                print(f"round {r + 1} {name}: {shown} (us/chunk)", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    print(f"load average at end: {load_average()}")
    print(f"\n| workload (server CPU us per chunk, median of {args.rounds}) | A | B | B/A |")
    print("|---|---:|---:|---:|")
    for key in results["A"]:
        a = statistics.median(results["A"][key])
        b = statistics.median(results["B"][key])
        print(f"| {key} | {a:.0f} | {b:.0f} | {b / a:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
