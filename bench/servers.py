"""Start a server as its own process group, wait for /health, read its CPU time, stop it.

A system under test is just a command line and a base URL. CPU time is read from /proc: utime +
stime of every live process in the server's tree plus cutime + cstime of the root (children that
already exited), so worker processes count too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

_CLK_TCK = os.sysconf("SC_CLK_TCK")


class ServerDown(Exception):
    """The server process exited or never answered /health."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """One running server: its process group, its log file and its base URL."""

    def __init__(
        self, name: str, cmd: list[str], env: dict[str, str], cwd: Path, port: int, log: Path
    ):
        self.name = name
        self.cmd = cmd
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = log.open("wb")
        # A new session makes the server its own process-group leader, so stop() reaches workers.
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerDown(f"exited with code {self.proc.returncode} ({self.log_tail()})")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise ServerDown(f"no 200 from /health within {timeout_s:.0f} s ({self.log_tail()})")

    def log_tail(self, lines: int = 3) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:])[-300:]

    def cpu_seconds(self) -> float:
        """Server CPU time so far (user + system) of the whole process tree."""
        return tree_cpu_seconds(self.pid)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left after `grace_s`."""
        if self.proc.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        # Workers may outlive the leader; the group id is still the leader's pid.
        _signal_group(self.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        self._log.close()


def load_average() -> str:
    """1, 5 and 15 minute load averages: other work on the machine shows up here."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def tree_cpu_seconds(root: int) -> float:
    """CPU time so far (user + system) of ``root`` and every process under it."""
    return _tree_cpu_ticks(root) / _CLK_TCK


def process_cpu_seconds(pid: int) -> float:
    """CPU time so far (user + system) of ``pid`` alone, without its children."""
    fields = _read_stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _read_stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def _tree_cpu_ticks(root: int) -> int:
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _read_stat(int(entry))
        if fields is not None:
            stats[int(entry)] = fields
            parents[int(entry)] = int(fields[1])
    total = 0
    for pid, fields in stats.items():
        if _descends_from(pid, root, parents):
            # fields[11..14] are utime, stime, cutime, cstime (stat fields 14..17).
            total += int(fields[11]) + int(fields[12])
            if pid == root:
                total += int(fields[13]) + int(fields[14])
    return total


def _descends_from(pid: int, root: int, parents: dict[int, int]) -> bool:
    seen = 0
    while pid and seen < 64:
        if pid == root:
            return True
        pid = parents.get(pid, 0)
        seen += 1
    return False
