"""A SIGTERM'd server stops accepting, finishes the request it is running, and exits 0."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from tests.integration.server import RunningServer, running_server

WORDS = ["alpha", "beta", "gamma", "fox", "jumps", "over", "lazy", "dog", "42", "hello,", "world."]


def big_prompt(words: int) -> str:
    """About 5 characters a word."""
    rng = random.Random(7)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def in_flight_requests(server: RunningServer) -> float:
    """Requests being handled besides the /metrics scrape that asks."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "render_service_requests_in_flight":
                return sample.value - 1
    raise AssertionError("no render_service_requests_in_flight in /metrics")


def refuses_connections(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_sigterm_finishes_in_flight_request_and_exits_zero(
    default_model_dir: Path, tmp_path: Path
) -> None:
    # The request is held in flight by the client: its headers are sent (so the app is running
    # it) but the last bytes of its body only go out after SIGTERM. No race with the render.
    prompt = big_prompt(20_000)
    ids = Tokenizer.from_file(str(default_model_dir / "tokenizer.json")).encode(prompt).ids
    keep = 1000
    body = json.dumps({"prompt": prompt, "max_tokens": 1, "truncate_prompt_tokens": keep})
    head, tail = body[:-100].encode(), body[-100:].encode()
    with running_server([str(default_model_dir)], tmp_path) as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        connection.putrequest("POST", "/v1/completions/render")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(head) + len(tail)))
        connection.endheaders(head)
        for _ in range(200):  # bounded: the server reads the headers in milliseconds
            if in_flight_requests(server) >= 1:
                break
            time.sleep(0.05)
        assert in_flight_requests(server) >= 1
        os.kill(server.process.pid, signal.SIGTERM)
        for _ in range(200):
            if refuses_connections(server.port):
                break
            time.sleep(0.05)
        assert refuses_connections(server.port)
        connection.send(tail)
        response = connection.getresponse()
        assert response.status == 200
        assert json.loads(response.read())[0]["token_ids"] == ids[-keep:]
        connection.close()
        assert server.process.wait(timeout=60) == 0
    log = server.log.read_text()
    assert "draining: /ready now answers 503" in log
    assert "Traceback" not in log
    # The drained request was logged as one JSON access line with its status.
    lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    assert [(r["path"], r["status"]) for r in lines] == [("/v1/completions/render", 200)]


def test_sigterm_with_several_workers_exits_zero(default_model_dir: Path, tmp_path: Path) -> None:
    with running_server([str(default_model_dir), "--workers", "2"], tmp_path) as server:
        body = {"messages": [{"role": "user", "content": "Hello"}]}
        for _ in range(4):
            assert httpx.post(f"{server.url}/v1/chat/completions/render", json=body).is_success
        os.kill(server.process.pid, signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
