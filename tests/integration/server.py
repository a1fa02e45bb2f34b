"""Start a real render-service (uvicorn on 127.0.0.1, a free port) in a subprocess for a test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunningServer:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kwargs)  # type: ignore[arg-type]

    def alive(self) -> bool:
        return self.process.poll() is None


@contextmanager
def running_server(
    argv: list[str], tmp_path: Path, *, env: dict[str, str] | None = None, timeout: float = 90
) -> Iterator[RunningServer]:
    """``render-service serve ARGV`` on a free port; yields once /health answers 200."""
    port = free_port()
    log = tmp_path / f"server-{port}.log"
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), **(env or {})}
    cmd = [
        sys.executable,
        "-m",
        "render_service",
        "serve",
        *argv,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if "--workers" not in argv:
        cmd += ["--workers", "1"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    server = RunningServer(process, port, log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited early:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not become healthy:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield server
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
