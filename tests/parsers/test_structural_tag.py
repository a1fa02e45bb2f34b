"""Render-side answers (structural tag, skip_special_tokens, reasoning_ended) vs vLLM's render."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from parsers import ParseRequest, build_chat_parser
from tests.parsers import _golden as g

DIRS = ("qwen3", "qwen2.5-instruct", "deepseek-r1-distill-qwen", "qwen3-noparser")


def render_cases() -> list[Path]:
    if not g.shared_present():
        return []
    out = []
    for d in DIRS:
        for path in sorted((g.GOLDEN / d / "render").glob("*.json")):
            case = g.load(path)
            if case["path"] == "/v1/chat/completions/render" and case["status"] == 200:
                out.append(path)
    return out


CASES = render_cases()


@pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")
@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_render_fields(path: Path) -> None:
    case = g.load(path)
    body: dict[str, Any] = case["request"]
    response: dict[str, Any] = case["response"]
    flags = case["server_flags"]
    request = ParseRequest(
        tools=body.get("tools"),
        tool_choice=body.get("tool_choice"),
        parallel_tool_calls=body.get("parallel_tool_calls", True),
        include_reasoning=body.get("include_reasoning", True),
        chat_template_kwargs=body.get("chat_template_kwargs") or {},
        enable_auto_tools="--enable-auto-tool-choice" in flags,
    )
    model = case["model"]  # the served name is the model directory's name
    parser = build_chat_parser(
        g.flag(flags, "--reasoning-parser"),
        g.flag(flags, "--tool-call-parser"),
        g.facts(model),
        request,
    )
    params = response["sampling_params"]
    want_tag = (params.get("structured_outputs") or {}).get("structural_tag")
    want_skip = params.get("skip_special_tokens", True)
    if parser is None:
        assert want_tag is None
        assert want_skip == body.get("skip_special_tokens", True)
        assert response.get("reasoning_ended") == (True if not request.include_reasoning else None)
        return
    adjustments = parser.render_adjustments()
    assert adjustments.structural_tag == want_tag  # byte for byte
    skip = adjustments.skip_special_tokens
    assert (body.get("skip_special_tokens", True) if skip is None else skip) == want_skip
    assert parser.reasoning_ended(response["token_ids"]) == response.get("reasoning_ended")


@pytest.mark.skipif(not g.shared_present(), reason="../shared is absent")
@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_parse_context_decodes_to_same_answers(path: Path) -> None:
    # Derender clients send render's parse_context back; it must rebuild the same parser.
    case = g.load(path)
    context = case["response"].get("parse_context")
    if context is None:
        pytest.skip("vLLM returned no parse_context for this case")
    flags = case["server_flags"]
    request = msgspec.json.decode(msgspec.json.encode(context), type=ParseRequest)
    request = msgspec.structs.replace(
        request, enable_auto_tools="--enable-auto-tool-choice" in flags
    )
    parser = build_chat_parser(
        g.flag(flags, "--reasoning-parser"),
        g.flag(flags, "--tool-call-parser"),
        g.facts(case["model"]),
        request,
    )
    params = case["response"]["sampling_params"]
    want_tag = (params.get("structured_outputs") or {}).get("structural_tag")
    assert (parser.structural_tag() if parser else None) == want_tag
