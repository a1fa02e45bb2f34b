"""Model load and server start, with and without transformers, A/B in one run.

    PYTHONPATH=. python bench/load_bench.py --models qwen3,llama-3.1-instruct --rounds 3

Two measurements, each in fresh processes, the two variants alternating round by round:

- *library*: ``import render_service.library``, ``Renderer.from_pretrained(model)`` and a first
  render; wall seconds, CPU seconds (user + system) and peak RSS of the process;
- *server*: ``render-service serve model`` (one worker) until ``GET /health`` answers 200; wall
  seconds from the spawn.

Variants: ``fast`` (the default loader) and ``transformers`` (``RENDER_SERVICE_TOKENIZER_LOADER=
transformers``: transformers' ``AutoTokenizer``, what every load did before). ``--before-repo``
adds a third, another checkout run with its own code (e.g. main before the change). Medians.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO.parent / "shared" / "models"

_LIBRARY = """
import json, resource, sys, time
start = time.perf_counter()
from render_service.library import Renderer
renderer = Renderer.from_pretrained(sys.argv[1])
assert renderer.tokenize({"messages": [{"role": "user", "content": "Hello there"}]}).tokens
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
                  "rss_mb": usage.ru_maxrss / 1024, "transformers": "transformers" in sys.modules}))
"""


def _env(variant: str, repo: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"}
    env.pop("RENDER_SERVICE_TOKENIZER_LOADER", None)
    if variant == "transformers":
        env["RENDER_SERVICE_TOKENIZER_LOADER"] = "transformers"
    return env


def library_load(variant: str, repo: Path, model: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _LIBRARY, str(model)],
        capture_output=True,
        text=True,
        env=_env(variant, repo),
        cwd=repo,
        check=True,
        timeout=600,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_start(variant: str, repo: Path, model: Path) -> float:
    port = _free_port()
    command = [sys.executable, "-m", "render_service", "serve", str(model), "--host",
               "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    env = {**_env(variant, repo), "RENDER_SERVICE_STATE_SECRET": "load-bench-" + "0" * 32}
    start = time.perf_counter()
    process = subprocess.Popen(
        command, env=env, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while time.perf_counter() - start < 600:
            if process.poll() is not None:
                raise RuntimeError(f"the server exited with {process.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - start
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("no /health 200 within 600 s")
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen3,llama-3.1-instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before-repo", type=Path, help="another checkout, run as 'before'")
    parser.add_argument("--no-server", action="store_true", help="only the library load")
    args = parser.parse_args()
    variants: list[tuple[str, str, Path]] = [
        ("fast", "fast", REPO),
        ("transformers", "transformers", REPO),
    ]
    if args.before_repo is not None:
        variants.append(("before", "fast", args.before_repo.resolve()))
    results: dict[tuple[str, str], dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for name in args.models.split(","):
            for label, variant, repo in variants:
                row = results.setdefault((name, label), {})
                lib = library_load(variant, repo, MODELS / name)
                for key in ("wall", "cpu", "rss_mb"):
                    row.setdefault(key, []).append(float(lib[key]))
                row.setdefault("transformers", []).append(float(lib["transformers"]))
                if not args.no_server:
                    row.setdefault("server", []).append(server_start(variant, repo, MODELS / name))
    print(
        "| model | variant | library load wall s | CPU s | peak RSS MB | imports transformers "
        "| server start to /health s |"
    )
    print("|---|---|---|---|---|---|---|")
    for (name, label), row in results.items():
        server = f"{statistics.median(row['server']):.2f}" if "server" in row else "-"
        print(
            f"| {name} | {label} | {statistics.median(row['wall']):.2f} | "
            f"{statistics.median(row['cpu']):.2f} | {statistics.median(row['rss_mb']):.0f} | "
            f"{'yes' if max(row['transformers']) else 'no'} | {server} |"
        )


if __name__ == "__main__":
    main()
