"""The three-hop loop a client of render-service runs, streaming: render a chat request, send
the answer to the engine's ``/inference/v1/generate``, and derender each SSE event the engine
sends back with the lean protocol (the first call carries the prompt ids and the chat request,
every later one only the ``stream_state`` the previous call returned).

    python examples/client.py "Say hello" --render http://127.0.0.1:8000 --engine http://127.0.0.1:8001

Prints the answer as it streams, then its finish_reason. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    """What a client would have sent its own caller: the OpenAI chunks, and their sum."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None


def post(url: str, body: dict[str, Any], api_key: str | None = None) -> Any:
    """POST JSON, answer JSON; an error status raises with the server's message."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=_headers(api_key), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{url}: {exc.code} {exc.read().decode(errors='replace')}") from exc


def sse_events(url: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The JSON payloads of an SSE answer, up to ``[DONE]``."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers=_headers(None), method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        for raw in answer:
            line = raw.decode().rstrip("\r\n")
            if not line.startswith("data: "):
                continue  # blank separators (and comments)
            data = line.removeprefix("data: ")
            if data == "[DONE]":
                return
            event = json.loads(data)
            if "error" in event:  # an engine error after the 200: vLLM sends it as an event
                raise RuntimeError(f"{url}: {event['error']}")
            yield event


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def chat(
    chat_request: dict[str, Any],
    render_url: str,
    engine_url: str,
    api_key: str | None = None,
    on_chunk: Callable[[dict[str, Any]], None] = lambda chunk: None,
) -> Answer:
    """Run one streaming chat request through render, the engine and derender."""
    chat_request = {**chat_request, "stream": True}
    # 1. Render: the GenerateRequest to send to the engine unchanged.
    generate = post(f"{render_url}/v1/chat/completions/render", chat_request, api_key)
    answer = Answer()
    states: dict[int, Any] = {}  # one stream_state per choice index (n > 1)
    # 2. Generate: one SSE event per choice per engine step.
    for event in sse_events(f"{engine_url}/inference/v1/generate", generate):
        if not event["choices"]:
            continue  # a usage-only event (stream_options.include_usage) holds no output
        index = event["choices"][0]["index"]
        body: dict[str, Any] = {"stream": True, "generate_chunk": event}
        if index in states:  # lean protocol: the state carries the rest
            body["stream_state"] = states[index]
        else:
            body |= {"prompt_token_ids": generate["token_ids"], "chat_request": chat_request}
        # 3. Derender: the OpenAI chunk for the client, and the state for the next call.
        derendered = post(f"{render_url}/v1/chat/completions/derender", body, api_key)
        states[index] = derendered["stream_state"]
        chunk = derendered["chunk"]
        answer.chunks.append(chunk)
        for choice in chunk["choices"]:
            delta = choice["delta"]
            answer.content += delta.get("content") or ""
            answer.reasoning += delta.get("reasoning") or ""
            answer.tool_calls += delta.get("tool_calls") or []
            answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
        on_chunk(chunk)
    return answer


def _print_content(chunk: dict[str, Any]) -> None:
    for choice in chunk["choices"]:
        sys.stdout.write(choice["delta"].get("content") or "")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> Answer:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompt", help="the user message")
    parser.add_argument("--render", default="http://127.0.0.1:8000", help="render-service URL")
    parser.add_argument("--engine", default="http://127.0.0.1:8001", help="the engine's URL")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument(
        "--chunks", action="store_true", help="print each OpenAI chunk as an SSE line instead"
    )
    args = parser.parse_args(argv)
    request = {
        "messages": [{"role": "user", "content": args.prompt}],
        "max_tokens": args.max_tokens,
    }

    def show(chunk: dict[str, Any]) -> None:
        print(f"data: {json.dumps(chunk)}\n", flush=True)

    answer = chat(
        request,
        args.render.rstrip("/"),
        args.engine.rstrip("/"),
        api_key=os.environ.get("VLLM_API_KEY"),
        on_chunk=show if args.chunks else _print_content,
    )
    if args.chunks:
        print("data: [DONE]")
    else:
        print(f"\nfinish_reason: {answer.finish_reason}")
    return answer


if __name__ == "__main__":
    main()
