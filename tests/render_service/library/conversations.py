"""Random multi-turn conversations (tools, tool calls and results, reasoning) for every shared
model, and the renderer of each model as its golden server was configured."""

from __future__ import annotations

import json
from functools import cache, lru_cache
from typing import Any

import pytest
from hypothesis import strategies as st

from render_service.errors import RenderServiceError
from render_service.http.cli import parse_settings
from render_service.library import Renderer
from tests.golden import GOLDEN, MODELS

WORDS = ["alpha", "beta", "gamma", "delta", "sun", "rain", "Paris", "7", "ok", "über", "日本"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    },
]


def model_dirs() -> list[str]:
    return sorted(p.name for p in MODELS.glob("*") if (p / "READY").exists())


# Flags of a golden server that change what a template renders (parser flags do not).
_TEMPLATE_FLAGS = ("--tokenizer-mode", "--chat-template-content-format")


def _flags(model: str) -> list[str]:
    """The template-relevant server flags of the model's golden cases (e.g. Mistral's mode)."""
    for path in sorted(GOLDEN.glob("*/render/*.json")):
        case = json.loads(path.read_text(encoding="utf-8"))
        if case.get("model") != model:
            continue
        flags = case.get("server_flags") or []
        return [
            item
            for i, flag in enumerate(flags)
            if flag in _TEMPLATE_FLAGS
            for item in (flag, flags[i + 1])
        ]
    return []


@lru_cache(maxsize=2)  # a renderer per model held for the whole run exhausts memory
def renderer(model: str) -> Renderer:
    argv = [str(MODELS / model), "--served-model-name", model, *_flags(model)]
    return Renderer.from_settings(parse_settings(argv))


def _can_render(r: Renderer, request: dict[str, Any]) -> bool:
    try:
        r.tokenize(request)
    except RenderServiceError:
        return False
    return True


@cache
def capabilities(model: str) -> tuple[bool, bool, bool]:
    """(renders multi-turn at all, renders tools with tool calls and results, renders two calls
    in one message: Llama 3.1's template refuses parallel calls). Skips a model that renders
    only with its generation prompt (Harmony, Mistral's request format)."""
    r = renderer(model)
    if r.model.harmony is not None:
        pytest.skip(f"{model} renders with Harmony (always with its generation prompt)")
    if r.model.mistral is not None:
        pytest.skip(f"{model} renders with mistral_common (always with its generation prompt)")
    plain = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    calls = [
        {"role": "user", "content": "a"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call(0, "get_weather", {"city": "x"})],
        },
        {"role": "tool", "tool_call_id": _call_id(0), "content": "sunny"},
    ]
    parallel = [
        *calls[:1],
        {**calls[1], "tool_calls": [_call(0, "get_weather", {"city": "x"}), _call(1, "add", {})]},
        calls[2],
        {"role": "tool", "tool_call_id": _call_id(1), "content": "3"},
    ]
    return (
        _can_render(r, {"messages": plain}),
        _can_render(r, {"messages": calls, "tools": TOOLS}),
        _can_render(r, {"messages": parallel, "tools": TOOLS}),
    )


def _call_id(n: int) -> str:
    return f"call{n:05d}"  # nine characters: Mistral's templates insist on that length


def _call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": _call_id(n),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


_text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)


@st.composite
def conversations(draw: st.DrawFn, tools: bool, parallel: bool) -> dict[str, Any]:
    """A request whose conversation ends with an assistant message, with the next messages.

    Message texts carry their index ("m3 ...") so a test can find each in the rendering.
    """
    messages: list[dict[str, Any]] = []

    def tag(text: str) -> str:
        return f"m{len(messages)} {text}"

    if draw(st.booleans()):
        messages.append({"role": "system", "content": tag(draw(_text))})
    calls = 0
    for turn in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": tag(draw(_text))})
        for _ in range(draw(st.integers(0, 2)) if tools else 0):
            n = draw(st.integers(1, 2 if parallel else 1))
            made = [_call(calls + i, "get_weather", {"city": draw(_text)}) for i in range(n)]
            message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": made}
            if draw(st.booleans()):
                message["reasoning"] = tag(draw(_text))
            messages.append(message)
            for call in made:
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": tag(draw(_text))}
                )
            calls += n
        answer: dict[str, Any] = {"role": "assistant", "content": tag(draw(_text))}
        if draw(st.booleans()):
            answer["reasoning"] = tag(draw(_text))
        if tools and turn == 0 and draw(st.booleans()):
            answer["tool_calls"] = [_call(calls, "add", {"a": 1, "b": 2})]
            answer["content"] = ""
            calls += 1
        messages.append(answer)
    last = messages[-1]
    new: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": c["id"], "content": "m-new result"}
        for c in last.get("tool_calls", [])
    ]
    if not new or draw(st.booleans()):
        new.append({"role": "user", "content": "m-new " + draw(_text)})
    request: dict[str, Any] = {"messages": messages}
    if tools:
        request["tools"] = TOOLS
    return {"request": request, "new": new}
