"""Our stream events through the official SDKs' stream helpers, offline (an httpx2 mock transport)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import msgspec
import openai


def sse(events: list[Any]) -> bytes:
    """Events as the SSE a client relays: ``event:`` is each event's ``type``."""
    out = []
    for event in events:
        data = msgspec.to_builtins(event)
        out.append(f"event: {data['type']}\ndata: {json.dumps(data)}\n\n")
    return "".join(out).encode()


def _client(body: bytes) -> httpx2.Client:
    """The SDKs' own HTTP client answering every request with ``body`` as an event stream."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx2.Client(transport=httpx2.MockTransport(handler))


def anthropic_final(events: list[Any]) -> dict[str, Any]:
    """The message ``anthropic``'s ``messages.stream`` accumulates from ``events``."""
    client = anthropic.Anthropic(
        api_key="k", base_url="http://sdk.test", http_client=_client(sse(events))
    )
    with client.messages.stream(model="m", max_tokens=1, messages=[]) as stream:
        return stream.get_final_message().model_dump(exclude_none=True)


def openai_final(events: list[Any]) -> dict[str, Any]:
    """The response ``openai``'s ``responses.stream`` accumulates from ``events``."""
    client = openai.OpenAI(
        api_key="k", base_url="http://sdk.test/v1", http_client=_client(sse(events))
    )
    with client.responses.stream(model="m", input="x") as stream:
        return stream.get_final_response().model_dump()


def like(got: Any, want: Any) -> Any:
    """``got`` cut down to the keys ``want`` has (SDK models carry extra optional fields)."""
    if isinstance(want, dict) and isinstance(got, dict):
        return {k: like(got.get(k), v) for k, v in want.items()}
    if isinstance(want, list) and isinstance(got, list):
        return [like(g, w) for g, w in zip(got, want, strict=False)] + got[len(want) :]
    return got
