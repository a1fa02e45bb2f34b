"""The plain-Python renderers of known chat templates against the templates themselves: the same
text (or the same error) on random conversations, recognition by the template's exact text, and
the same ids through the whole render path with the renderers on and off."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from render_service.model import chat_jinja, known_templates
from render_service.model.loading import _load_chat_template, read_json
from render_service.render import Renderer
from tests.golden import MODELS, needs_shared
from tests.render_service.model._templates import outcome, shared_template

KNOWN = {"qwen3": known_templates.render_qwen3, "qwen2.5-instruct": known_templates.render_qwen25}
SPECIAL_TOKENS = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


_TEXT = st.lists(
    st.sampled_from(
        [
            *list("ab Z09,.\n{}\"'"),
            "é",
            "🌍",
            "<think>",
            "</think>",
            "\n\n",
            "<tool_response>",
            "</tool_response>",
            "<|im_end|>",
        ]
    ),
    max_size=12,
).map("".join)
_ARGUMENTS = st.one_of(
    _TEXT,
    st.dictionaries(st.sampled_from(["city", "q", "é"]), st.one_of(_TEXT, st.integers())),
    st.lists(st.integers(), max_size=2),
    st.none(),
)


def _rarely(draw: st.DrawFn, odd: bool) -> bool:
    """With ``odd``, True about once in 15 draws (odd inputs stay rare); else never."""
    return odd and draw(st.integers(0, 14)) == 0


@st.composite
def _tool_call(draw: st.DrawFn, odd: bool = True) -> Any:
    function: dict[str, Any] = {"name": draw(st.sampled_from(["get", "put"]))}
    function["arguments"] = draw(_ARGUMENTS)
    if _rarely(draw, odd):
        del function[draw(st.sampled_from(["name", "arguments"]))]
    if _rarely(draw, odd):
        function["name"] = draw(st.integers(0, 3))
    if _rarely(draw, odd):  # the call's fields at its top level
        return {"id": "c", **function}
    if _rarely(draw, odd):
        return {"id": "c", "function": draw(st.one_of(st.just({}), st.none(), _TEXT))}
    if _rarely(draw, odd):
        return draw(st.one_of(_TEXT, st.none()))
    return {"id": "c", "type": "function", "function": function}


@st.composite
def _message(draw: st.DrawFn, odd: bool = True) -> dict[str, Any]:
    role: Any = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    if _rarely(draw, odd):
        role = draw(st.sampled_from(["developer", "critic", 7]))
    content: Any = draw(_TEXT)
    if draw(st.integers(0, 4)) == 0:
        content = f"<tool_response>{content}</tool_response>"
    if _rarely(draw, odd):
        content = draw(st.one_of(st.none(), st.just([{"type": "text", "text": "x"}])))
    message: dict[str, Any] = {"role": role, "content": content}
    if _rarely(draw, odd):
        del message["content"]
    if role == "assistant":
        if draw(st.booleans()):
            message["reasoning_content"] = draw(_TEXT)
            if _rarely(draw, odd):
                message["reasoning_content"] = draw(st.one_of(st.none(), st.just(["r"])))
        if draw(st.booleans()):
            message["tool_calls"] = draw(st.lists(_tool_call(odd), max_size=3))
            if _rarely(draw, odd):
                message["tool_calls"] = draw(st.one_of(st.just({"a": 1}), _TEXT))
    return message


_TOOL = st.builds(
    lambda name, description: {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": {"type": "object"}},
    },
    st.sampled_from(["get", "put"]),
    _TEXT,
)
_TOOLS = st.one_of(st.none(), st.lists(_TOOL, max_size=2))
_PLAIN_KWARGS = st.fixed_dictionaries(
    {"add_generation_prompt": st.booleans()},
    optional={"enable_thinking": st.booleans(), "documents": st.just([{"title": "T"}])},
)
_KWARGS = _PLAIN_KWARGS | st.fixed_dictionaries(
    {"add_generation_prompt": st.one_of(st.booleans(), st.just(1))},
    optional={
        "enable_thinking": st.one_of(st.booleans(), st.none(), st.just(0)),
        "continue_final_message": st.booleans(),
        "messages": st.just([]),
        "namespace": st.just(1),
        "other": st.just("x"),
    },
)


@needs_shared
@pytest.mark.parametrize("name", sorted(KNOWN))
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_message(), min_size=1, max_size=7), _TOOLS, _KWARGS)
def test_a_known_renderer_gives_the_templates_text(
    name: str, conversation: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]
) -> None:
    template = shared_template(name)
    known = known_templates.known_template(template)
    assert known is KNOWN[name]

    def render(renderer: Any) -> str:
        return chat_jinja.render_chat(
            template, conversation, tools, SPECIAL_TOKENS, dict(kwargs), renderer
        )

    assert outcome(lambda: render(known)) == outcome(lambda: render(None))


@needs_shared
@pytest.mark.parametrize("name", sorted(KNOWN))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_message(odd=False), min_size=1, max_size=7), _TOOLS, _PLAIN_KWARGS)
def test_plain_conversations_take_the_plain_python_path(
    name: str, conversation: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]
) -> None:
    """Conversations of the shapes the renderers cover: each one is rendered by the renderer
    (not the fallback), to the template's text."""
    template = shared_template(name)
    known = KNOWN[name]
    texts: list[str | None] = []

    def recording(*args: Any) -> str | None:
        texts.append(known(*args))
        return texts[-1]

    ours = chat_jinja.render_chat(
        template, conversation, tools, SPECIAL_TOKENS, dict(kwargs), recording
    )
    assert texts and texts[0] is not None
    assert ours == chat_jinja.render_chat(template, conversation, tools, SPECIAL_TOKENS, kwargs)


@needs_shared
@pytest.mark.parametrize("name", sorted(KNOWN))
def test_a_plain_conversation_is_covered(name: str) -> None:
    """The shapes real requests have take the plain-Python path (not only the fallback)."""
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Call the tool.",
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "get", "arguments": {}}}
            ],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Thanks"},
    ]
    tools = [
        {"type": "function", "function": {"name": "get", "description": "d", "parameters": {}}}
    ]
    for enable_thinking in ({}, {"enable_thinking": False}):
        chat = [chat_jinja._message(m, True) for m in conversation]
        text = KNOWN[name](chat, tools, True, {**SPECIAL_TOKENS, **enable_thinking})
        assert text is not None
        assert text == chat_jinja.render_chat(
            shared_template(name),
            conversation,
            tools,
            SPECIAL_TOKENS,
            {"add_generation_prompt": True, **enable_thinking},
        )


@needs_shared
def test_only_the_exact_templates_are_known() -> None:
    for path in sorted(MODELS.iterdir()):
        if not path.is_dir():
            continue
        template = _load_chat_template(path, read_json(path / "tokenizer_config.json"))
        expected = KNOWN.get(path.name)
        assert known_templates.known_template(template) is expected, path.name
        if expected is not None:
            assert known_templates.known_template(template + "\n") is None


@needs_shared
@pytest.mark.parametrize("name", sorted(KNOWN))
def test_the_render_path_gives_the_same_ids_with_and_without_the_renderers(name: str) -> None:
    flags = {"tool_call_parser": "hermes", "enable_auto_tool_choice": True}
    on = Renderer.from_pretrained(str(MODELS / name), served_model_name="m", **flags)
    off = Renderer.from_pretrained(
        str(MODELS / name), served_model_name="m", known_chat_templates=False, **flags
    )
    assert on.known_template is KNOWN[name]
    assert off.known_template is None
    tools = [
        {"type": "function", "function": {"name": "get", "description": "d", "parameters": {}}}
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris? é 🌍"},
        {
            "role": "assistant",
            "content": "<think>\nhm\n</think>\n\nLet me check.",
            "tool_calls": [
                {
                    "id": "c",
                    "type": "function",
                    "function": {"name": "get", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "c"},
        {"role": "user", "content": "Thanks"},
    ]
    for extra in ({}, {"tools": tools}, {"chat_template_kwargs": {"enable_thinking": False}}):
        request = {"model": "m", "messages": messages, **extra}
        assert on.render_chat(request).token_ids == off.render_chat(request).token_ids


def test_the_tools_json_is_kept_per_tool_set_and_tells_apart_what_prints_apart() -> None:
    cache = known_templates.TOOL_BLOCKS
    messages = [{"role": "user", "content": "hi"}]

    def tools(default: Any) -> list[dict[str, Any]]:
        parameters = {"type": "object", "default": default}
        return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]

    values = [1, 1.0, True, None, float("nan"), "1", 2**70, 1]
    try:
        cache.resize(0)  # off: every block rendered afresh
        fresh = [known_templates.render_qwen3(messages, tools(v), True, {}) for v in values]
        cache.resize(1 << 20)
        kept = [known_templates.render_qwen3(messages, tools(v), True, {}) for v in values]
        again = [known_templates.render_qwen3(messages, tools(v), True, {}) for v in values]
        assert kept == again == fresh
        assert len(set(fresh)) == len(values) - 1  # only the repeated 1 prints alike
        assert len(cache) == len(values) - 2  # 2**70 has no msgpack key, 1 is kept once
        cache.resize(2000)
        for i in range(50):
            known_templates.render_qwen3(messages, tools(f"value {i}" * 10), True, {})
            assert cache.size().bytes <= 2000
    finally:
        cache.resize(16 * 1024 * 1024)
