"""A small stand-in for a vLLM 0.33 ``--tokens-only`` engine: ``POST /inference/v1/generate``
answers with token ids read from a script, as vLLM's generate endpoint shapes them (one SSE
event per choice per step with ``stream: true``, one JSON answer otherwise). It runs no model;
use it to try render-service end to end, or in tests of anything that talks to an engine.

The script is a JSON object: ``{"chunks": [[ids], [ids], ...]}``, the ids each step emits (the
last step should end with the model's end-of-turn id, as a real engine's output does), plus
optionally ``"finish_reason"`` (default "stop") and ``"stop_reason"`` (default null).

    python examples/fake_engine.py examples/hello.json --port 8001

Standard library only. ``running_engine(script)`` runs one in a thread (for tests).
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GENERATE = "/inference/v1/generate"
# vLLM's --tokens-only answer to stop strings (it does not detokenize).
_STOP_STRINGS = (
    "stop strings are not supported on a --tokens-only server because detokenization is "
    "disabled. Check stop strings on the coordinator, or use stop_token_ids."
)


class Script:
    """What the engine generates for every request, step by step."""

    def __init__(self, data: dict[str, Any]) -> None:
        chunks = data.get("chunks")
        if not isinstance(chunks, list) or not all(
            isinstance(c, list) and all(isinstance(i, int) and i >= 0 for i in c) for c in chunks
        ):
            raise ValueError('a script is {"chunks": [[token ids], ...]}')
        self.chunks: list[list[int]] = chunks
        self.finish_reason: str = data.get("finish_reason", "stop")
        self.stop_reason: int | str | None = data.get("stop_reason")

    @classmethod
    def load(cls, path: str | Path) -> Script:
        return cls(json.loads(Path(path).read_text(encoding="utf-8")))

    def steps(self, max_tokens: int | None) -> list[tuple[list[int], str | None, Any]]:
        """(ids, finish_reason, stop_reason) per step, cut at ``max_tokens`` ("length")."""
        out: list[tuple[list[int], str | None, Any]] = []
        emitted = 0
        for i, chunk in enumerate(self.chunks):
            last = i == len(self.chunks) - 1
            if (
                max_tokens is not None
                and emitted + len(chunk) >= max_tokens
                and not (last and emitted + len(chunk) == max_tokens)
            ):
                out.append((chunk[: max_tokens - emitted], "length", None))
                return out
            emitted += len(chunk)
            if last:
                out.append((chunk, self.finish_reason, self.stop_reason))
            else:
                out.append((chunk, None, None))
        return out


def _choice(index: int, ids: list[int], finish: str | None, stop: Any) -> dict[str, Any]:
    # vLLM's field order; every field is sent, null or not.
    return {
        "index": index,
        "finish_reason": finish,
        "stop_reason": stop,
        "token_ids": ids,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": None,
        "logprobs": None,
    }


def stream_events(request: dict[str, Any], request_id: str, script: Script) -> Iterator[str]:
    """The SSE payloads of a streaming answer, ``[DONE]`` last."""
    params = request.get("sampling_params") or {}
    steps = script.steps(params.get("max_tokens"))
    prompt = request.get("token_ids") or []
    options = request.get("stream_options") or {}
    first = True
    for ids, finish, stop in steps:
        for index in range(int(params.get("n", 1))):
            event: dict[str, Any] = {"request_id": request_id, "usage": None}
            if first and request.get("return_token_ids"):
                event["prompt_token_ids"] = prompt
            first = False
            event["output_mode"] = "tokens"
            event["choices"] = [_choice(index, ids, finish, stop)]
            yield json.dumps(event)
    if options.get("include_usage"):
        generated = sum(len(ids) for ids, _, _ in steps) * int(params.get("n", 1))
        usage = {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + generated,
            "completion_tokens": generated,
        }
        yield json.dumps(
            {"request_id": request_id, "usage": usage, "output_mode": "tokens", "choices": []}
        )
    yield "[DONE]"


def response(request: dict[str, Any], request_id: str, script: Script) -> dict[str, Any]:
    """The JSON answer of a non-streaming request."""
    params = request.get("sampling_params") or {}
    steps = script.steps(params.get("max_tokens"))
    ids = [i for chunk, _, _ in steps for i in chunk]
    finish, stop = (steps[-1][1], steps[-1][2]) if steps else ("stop", None)
    n = int(params.get("n", 1))
    prompt = request.get("token_ids") or []
    return {
        "request_id": request_id,
        "model": request.get("model"),
        "created": None,
        "usage": {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + len(ids) * n,
            "completion_tokens": len(ids) * n,
        },
        "prompt_token_ids": prompt if request.get("return_token_ids") else None,
        "output_mode": "tokens",
        "choices": [_choice(i, ids, finish, stop) for i in range(n)],
    }


class _Handler(BaseHTTPRequestHandler):
    server: _EngineServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: an example's output is the client's."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, b"", "application/json")
        else:
            self._error(404, f"{self.path} is not served by the fake engine", "Not Found")

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length)
        if self.path != GENERATE:
            self._error(404, f"{self.path} is not served by the fake engine", "Not Found")
            return
        try:
            request = json.loads(raw)
            if not isinstance(request, dict) or not isinstance(request.get("request_id"), str):
                raise ValueError("expected a GenerateRequest (render's answer)")
        except ValueError as exc:
            self._error(400, str(exc), "Bad Request")
            return
        if (request.get("sampling_params") or {}).get("stop"):
            self._error(400, _STOP_STRINGS, "BadRequestError")
            return
        request_id = "generate-tokens-" + (
            self.headers.get("x-request-id") or request["request_id"]
        )
        script = self.server.script
        if not request.get("stream"):
            body = json.dumps(response(request, request_id, script)).encode()
            self._send(200, body, "application/json")
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("connection", "close")
        self.end_headers()
        for payload in stream_events(request, request_id, script):
            self.wfile.write(f"data: {payload}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True

    def _error(self, status: int, message: str, kind: str) -> None:
        error = {"message": message, "type": kind, "param": None, "code": status}
        self._send(status, json.dumps({"error": error}).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _EngineServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], script: Script) -> None:
        super().__init__(address, _Handler)
        self.script = script


@contextmanager
def running_engine(script: Script, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """A fake engine serving ``script`` in a thread; yields its base URL (a free port by default)."""
    server = _EngineServer((host, port), script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", help='JSON file: {"chunks": [[token ids], ...]}')
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    server = _EngineServer((args.host, args.port), Script.load(args.script))
    print(f"fake engine on http://{args.host}:{server.server_address[1]}{GENERATE}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
