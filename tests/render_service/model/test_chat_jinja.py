"""Our chat-template environment against transformers' ``apply_chat_template(tokenize=False)``
(what vLLM 0.33 runs): the same text, or the same error message, for every shared model's
template on random conversations; and the sandbox still refuses what it refused."""

from __future__ import annotations

import enum
import functools
from pathlib import Path
from typing import Any

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from render_service.model import chat_jinja
from render_service.model.loading import _load_chat_template, read_json
from tests.golden import MODELS, needs_shared
from tests.render_service.model._templates import outcome, shared_template

TEMPLATED_MODELS = sorted(
    p.name
    for p in (MODELS.iterdir() if MODELS.is_dir() else [])
    if p.is_dir() and _load_chat_template(p, read_json(p / "tokenizer_config.json")) is not None
)


@functools.cache
def _tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODELS / name), local_files_only=True)


def _both(
    name: str,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    kwargs: dict[str, Any],
    template: str | None = None,
) -> tuple[tuple[str, str], tuple[str, str]]:
    tok = _tokenizer(name)
    template = template if template is not None else shared_template(name)
    theirs = outcome(
        lambda: tok.apply_chat_template(
            conversation=conversation,
            tools=tools,
            chat_template=template,
            tokenize=False,
            return_dict=False,
            **kwargs,
        )
    )
    ours = outcome(
        lambda: chat_jinja.render_chat(
            template, conversation, tools, dict(tok.special_tokens_map), kwargs
        )
    )
    return ours, theirs


_TEXT = st.lists(
    st.sampled_from(
        [*list("abc XYZ 019,.!?\n\t{}[]\"'<>|/_-"), "é", "你好", "🌍", "<|im_end|>", "<think>"]
    ),
    max_size=30,
).map("".join)
_ARGS = st.dictionaries(
    st.sampled_from(["city", "q", "n"]), st.one_of(_TEXT, st.integers(-5, 99)), max_size=3
)


@st.composite
def _message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "user", "assistant", "tool", "developer"]))
    message: dict[str, Any] = {"role": role, "content": draw(st.one_of(_TEXT, st.none()))}
    if role == "assistant":
        if draw(st.booleans()):
            message["reasoning_content"] = draw(_TEXT)
        if draw(st.booleans()):
            message["tool_calls"] = [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": draw(st.sampled_from(["get", "put"])), "arguments": a},
                }
                for i, a in enumerate(draw(st.lists(_ARGS, min_size=1, max_size=2)))
            ]
    if role == "tool":
        message["tool_call_id"] = "c0"
    if role == "user" and draw(st.booleans()):
        message["content"] = [{"type": "text", "text": draw(_TEXT)}]
    return message


_TOOLS = st.one_of(
    st.none(),
    st.lists(
        st.builds(
            lambda name, desc: {
                "type": "function",
                "function": {
                    "name": name,
                    "description": desc,
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                },
            },
            st.sampled_from(["get", "put"]),
            _TEXT,
        ),
        max_size=2,
    ),
)
_KWARGS = st.fixed_dictionaries(
    {"add_generation_prompt": st.booleans()},
    optional={
        "enable_thinking": st.booleans(),
        "continue_final_message": st.booleans(),
        "reasoning_effort": st.sampled_from(["low", "high"]),
        "documents": st.just([{"title": "T", "text": "doc"}]),
    },
)


@needs_shared
@pytest.mark.parametrize("name", TEMPLATED_MODELS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_message(), min_size=1, max_size=6), _TOOLS, _KWARGS)
def test_every_shared_template_renders_as_transformers_does(
    name: str, conversation: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]
) -> None:
    ours, theirs = _both(name, conversation, tools, kwargs)
    assert ours == theirs


@needs_shared
@pytest.mark.parametrize(
    ("template", "kwargs"),
    [
        ("{% for m in messages %}{{ m.items() | list | tojson }}{% endfor %}", {}),
        ("{{ messages[0].get('content') }}{{ messages[0].keys() | list }}", {}),
        ("{{ messages[0].content.format(1) }}{{ '{0.__class__}'.format(messages) }}", {}),
        ("{{ messages[0].__class__ }}", {}),
        ("{{ messages.append(1) }}", {}),
        ("{{ messages[0].update({'a': 1}) }}", {}),
        ("{{ messages[0].pop }}", {}),
        ("{% set ns = namespace(_x=1) %}{{ ns._x }}", {}),
        ("{% set ns = namespace(x=1) %}{% set ns._y = 2 %}", {}),
        ("{% set ns = namespace(x=1) %}{% set ns.x = ns.x + 1 %}{{ ns.x }}{{ ns.y }}", {}),
        ("{{ dict(a=1) | tojson }}{{ dict.fromkeys(['a'], 2) }}", {}),
        ("{{ dict.fromkeys() }}", {}),
        ("{{ strftime_now() }}{{ raise_exception() }}", {}),
        ("{{ tools | tojson(indent=2, sort_keys=true) }}{{ 'é<' | tojson }}", {}),
        ("{{ tools | tojson(separators=(',', ':')) }}{{ 1 | tojson(bad=1) }}", {}),
        ("{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}X{% endfor %}", {}),
        ("{% for m in messages %}{{ loop.index }}{% break %}{% endfor %}", {}),
        ("{% generation %}{% set x = 1 %}G{% endgeneration %}{{ x }}", {}),
        ("{{ raise_exception('no ' + messages[0].role) }}", {}),
        ("{{ strftime_now('%Y') | length }}", {}),
        ("{{ range(200000) | length }}", {}),
        ("  {% if true %}\n  a\n  {% endif %}\n{{ eos_token }}{{ bos_token }}", {}),
        ("{{ messages[0].content.split(' ') | join('|') }}{{ x.y }}", {}),
        ("{{ messages[0]['nope'] }}{{ messages[0].nope.deeper }}", {}),
        ("{{ messages[0].content.startswith('H', _loop_vars=1) }}", {}),
        ("{{ documents | tojson }}{{ foo }}", {"foo": "bar", "documents": [{"text": "d"}]}),
        ("{{ messages | tojson }}", {"continue_final_message": True}),
        ("{{ messages | tojson }}", {"tools": []}),
        ("{{ messages }}", {"messages": []}),
        ("{{ x }", {}),
        ("{{ padding }}{{ messages[-1].content }}", {"padding": True}),
    ],
)
def test_unusual_templates_render_and_fail_as_transformers_does(
    template: str, kwargs: dict[str, Any]
) -> None:
    conversation = [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi", "reasoning_content": "think"},
    ]
    ours, theirs = _both("qwen3", conversation, [{"type": "function"}], kwargs, template)
    assert ours == theirs


class _Color(enum.StrEnum):
    RED = "red"


@needs_shared
def test_rich_values_reach_the_template_as_plain_data() -> None:
    conversation: list[dict[str, Any]] = [
        {"role": "user", "content": _Color.RED, "extra": (1, _Color.RED), "none": None}
    ]
    template = "{{ messages | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}"
    ours, theirs = _both("qwen3", conversation, None, {}, template)
    assert ours == theirs
    assert ours[0] == "text"


def test_a_shared_sandbox_never_lets_a_template_mutate_its_input() -> None:
    conversation = [{"role": "user", "content": "x"}]
    for source in ("{{ messages.append(1) }}", "{{ messages[0].clear() }}"):
        with pytest.raises(jinja2.exceptions.SecurityError):
            chat_jinja.render_chat(source, conversation, None, {}, {})
    assert conversation == [{"role": "user", "content": "x"}]


def test_the_compiled_template_cache_is_bounded_in_bytes() -> None:
    chat_jinja.compile_template("{{ 1 }}")
    size = chat_jinja.COMPILED.size()
    assert size.entries >= 1
    assert 0 < size.bytes <= chat_jinja.COMPILED.max_bytes


def test_no_transformers_needed(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from render_service.model import chat_jinja\n"
        "print(chat_jinja.render_chat('{{ messages[0].content }}', "
        "[{'role': 'user', 'content': 'hi'}], None, {}, {}))\n"
        "print('transformers' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    ).stdout.split()
    assert out == ["hi", "False"]
