"""Startup failures end the server at once with one line (issue 14, classes 9 and 11).

Regressions: a model path that did not exist, with --workers 2, made the workers die and
restart forever (14 tracebacks in 15 s, never exiting); a hub id outside the local cache made
the server try the network; a placeholder or short state secret was accepted.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from render_service.model.loading import resolve_model_path
from tests.integration.server import REPO, free_port


def start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``render-service serve ARGV`` on a free port; it must exit by itself."""
    cmd = [sys.executable, "-m", "render_service", "serve", *argv, "--port", str(free_port())]
    inherited = {k: v for k, v in os.environ.items() if k != "RENDER_SERVICE_STATE_SECRET"}
    full_env = {**inherited, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=120)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("render-service: ")
    return lines[0]


def test_a_missing_model_path_with_two_workers_exits_with_one_line(tmp_path: Path) -> None:
    line = one_line(start([str(tmp_path / "no-such-model"), "--workers", "2"]))
    assert "no-such-model" in line


def test_a_directory_without_a_tokenizer_exits_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert "no tokenizer" in one_line(start([str(tmp_path), "--workers", "2"]))


def test_a_hub_id_outside_the_local_cache_exits_with_one_line(tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0"}
    line = one_line(start(["someone/not-in-the-cache", "--workers", "2"], env))
    assert "hub cache" in line


def test_a_hub_id_outside_the_cache_never_touches_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError("network refused by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    with pytest.raises(FileNotFoundError, match="hub cache"):
        resolve_model_path("someone/not-in-the-cache")
    assert attempts == []


def test_a_model_larger_context_than_it_has_exits_with_one_line(default_model_dir: Path) -> None:
    line = one_line(start([str(default_model_dir), "--max-model-len", "100000000"]))
    assert "--max-model-len" in line


@pytest.mark.parametrize(
    "secret,reason",
    [
        ("replace-me-with-32-random-bytes-hex", "placeholder"),
        ("CHANGEME-0123456789abcdef0123456789", "placeholder"),
        ("short-secret", "12 bytes"),
        ("x" * 31, "31 bytes"),
    ],
)
def test_a_placeholder_or_short_state_secret_is_refused(
    default_model_dir: Path, secret: str, reason: str
) -> None:
    for argv, env in (
        (["--state-secret", secret], None),
        ([], {"RENDER_SERVICE_STATE_SECRET": secret}),
    ):
        result = start([str(default_model_dir), *argv], env)
        line = one_line(result)
        assert reason in line
        assert secret not in line
