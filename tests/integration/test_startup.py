"""What a server says when it starts, when it cannot, and when a client takes a wrong turn."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from render_service import __version__
from tests.golden import model_dir, needs_shared
from tests.integration.server import REPO, RunningServer, free_port, running_server


def serve(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "render_service", "serve", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def server(
    default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    argv = [
        str(default_model_dir),
        "--served-model-name",
        "tiny",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    with running_server(argv, tmp_path_factory.mktemp("startup")) as running:
        yield running


def test_one_startup_line_names_model_parsers_workers_and_address(server: RunningServer) -> None:
    log = server.log.read_text()
    (line,) = [line for line in log.splitlines() if f"render-service {__version__} serving" in line]
    assert "'tiny'" in line
    assert " with tool-call parser hermes; " in line
    assert "1 worker process x 1 render thread" in line
    assert line.endswith(f"http://127.0.0.1:{server.port}")
    assert "PyTorch was not found" not in log


def test_a_generation_path_says_the_engine_serves_it(server: RunningServer) -> None:
    with server.client() as client:
        answer = client.post("/v1/chat/completions", json={"messages": []})
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["code"] == 404 and error["type"] == "Not Found"
    assert "generation is served by the engine" in error["message"]
    assert "/v1/chat/completions/render" in error["message"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/no/such/path", 404),
        ("POST", "/inference/v1/generate", 404),
        ("GET", "/v1/chat/completions/render", 405),
        ("POST", "/health", 405),
    ],
)
def test_404_and_405_answer_in_vllms_error_shape(
    server: RunningServer, method: str, path: str, status: int
) -> None:
    with server.client() as client:
        answer = client.request(method, path)
    assert answer.status_code == status
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status and body["error"]["message"]
    if status == 405:
        assert "allow" in answer.headers
        assert answer.headers["allow"] in body["error"]["message"]


def test_a_missing_model_is_one_line_and_a_failure(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    out = serve(str(missing), "--port", str(free_port()))
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        f"render-service: model {str(missing)!r} is neither a directory nor in the hub cache"
    ]


def test_an_address_in_use_is_named(default_model_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = serve(str(default_model_dir), "--host", "127.0.0.1", "--port", str(port))
    assert out.returncode != 0
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"render-service: cannot listen on 127.0.0.1:{port}: ")
    assert "Address already in use" in line


@needs_shared
@pytest.mark.parametrize(
    "flags",
    [
        ["--reasoning-parser", "qwen3"],
        ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
    ],
    ids=["reasoning", "tools"],
)
def test_gpt_oss_with_another_parser_family_fails_before_any_worker(flags: list[str]) -> None:
    out = serve(str(model_dir("gpt-oss")), "--port", str(free_port()), *flags)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "render-service: gpt-oss output is Harmony: use --reasoning-parser openai_gptoss "
        "(the default) and --tool-call-parser openai"
    ]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_parser_the_model_cannot_serve_stops_the_server_with_one_line(
    default_model_dir: Path, workers: str
) -> None:
    # Every worker fails the same way: uvicorn's supervisor used to respawn them forever.
    out = serve(
        str(default_model_dir),
        *("--port", str(free_port()), "--workers", workers),
        *("--enable-auto-tool-choice", "--tool-call-parser", "mistral"),
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "render-service: a worker process could not start: UnsupportedModelError: parser "
        "'mistral' needs the token '[TOOL_CALLS]', which this tokenizer does not have"
    )
