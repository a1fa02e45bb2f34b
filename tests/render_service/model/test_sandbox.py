"""Per-request templates in the sandbox: same text as in-process, and a runaway template is
stopped by its time, output or memory limit while the sandbox keeps serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from render_service import Renderer
from render_service.errors import InvalidRequest, TemplateLimit
from render_service.model.default_model import ensure_default_model
from render_service.model.sandbox import TemplateSandbox
from render_service.model.templating import apply_template, build_conversation

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris? 🌧"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "rain", "tool_call_id": "c1"},
    ],
]


@pytest.fixture(scope="module")
def renderer(tmp_path_factory: pytest.TempPathFactory) -> Renderer:
    model: Path = ensure_default_model(tmp_path_factory.mktemp("model"))
    return Renderer.from_pretrained(str(model))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[TemplateSandbox]:
    box = TemplateSandbox(
        workers=1, timeout=3, max_output_chars=50_000, memory_bytes=256 * 1024 * 1024
    )
    yield box
    box.close()


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_sandbox_renders_what_the_in_process_path_renders(
    renderer: Renderer,
    sandbox: TemplateSandbox,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> None:
    tok = renderer.model.special_tokens_map
    template = renderer.model.info.chat_template
    assert template is not None
    convo = build_conversation(conversation, "string", False)
    kwargs = {"add_generation_prompt": True}
    local = apply_template(tok, template, convo, tools, kwargs)
    boxed = apply_template(tok, template, convo, tools, kwargs, sandbox)
    assert boxed == local


@pytest.mark.parametrize(
    ("source", "flag"),
    [
        (
            "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
            "--template-timeout",
        ),
        ("{% for i in range(99999) %}0123456789{% endfor %}", "--max-template-output-chars"),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "--template-memory-bytes",
        ),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed"),
    ],
)
def test_runaway_template_is_stopped_and_the_sandbox_recovers(
    renderer: Renderer, sandbox: TemplateSandbox, source: str, flag: str
) -> None:
    tok = renderer.model.special_tokens_map
    convo = build_conversation(CONVERSATIONS[0], "string", False)
    with pytest.raises(TemplateLimit) as info:
        apply_template(tok, source, convo, None, {}, sandbox)
    assert flag in info.value.message
    assert apply_template(tok, "U:{{ messages[0].content }}", convo, None, {}, sandbox) == "U:Hi"


def test_template_errors_keep_their_message(renderer: Renderer, sandbox: TemplateSandbox) -> None:
    convo = build_conversation(CONVERSATIONS[0], "string", False)
    tok = renderer.model.special_tokens_map
    with pytest.raises(InvalidRequest) as info:
        apply_template(tok, "{{ raise_exception('nope') }}", convo, None, {}, sandbox)
    assert info.value.message == "nope"
    with pytest.raises(InvalidRequest, match="unsafe"):
        apply_template(tok, "{{ messages.append(1) }}", convo, None, {}, sandbox)
