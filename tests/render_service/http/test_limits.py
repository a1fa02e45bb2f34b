"""Request limits: each names its flag, nesting is measured without recursion, ints fit int64,
and a request that outlives --request-timeout gets a clean 408 while the server keeps going."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request
from starlette.responses import Response

from render_service import Renderer
from render_service.errors import InvalidRequest, LimitExceeded
from render_service.http.app import build_app
from render_service.http.limits import Limits, check_depth, check_int64, count_images
from render_service.model.default_model import ensure_default_model
from render_service.protocol.chat import ChatCompletionRequest

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def chat(**fields: Any) -> ChatCompletionRequest:
    return msgspec.convert(
        {"messages": [{"role": "user", "content": "x"}], **fields}, ChatCompletionRequest
    )


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def test_depth_is_measured_iteratively_even_far_past_the_recursion_limit() -> None:
    with pytest.raises(LimitExceeded, match="--max-json-depth"):
        check_depth(nested(100_000), 64, "x")
    check_depth(nested(63), 64, "x")
    check_depth(nested(100_000), 0, "x")  # 0 turns the check off


def _depth(value: Any) -> int:
    """Nesting depth of lists/dicts, recursively (the reference for small values)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


JSON_VALUES = st.recursive(
    st.none() | st.integers() | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=2), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(value=JSON_VALUES, limit=st.integers(1, 8))
def test_depth_check_refuses_exactly_what_nests_deeper_than_the_limit(
    value: Any, limit: int
) -> None:
    if _depth(value) > limit:
        with pytest.raises(LimitExceeded, match="--max-json-depth"):
            check_depth(value, limit, "x")
    else:
        check_depth(value, limit, "x")


@pytest.mark.parametrize(
    ("limits", "request_", "flag"),
    [
        (
            Limits(max_messages=2),
            chat(messages=[{"role": "user", "content": "x"}] * 3),
            "--max-messages",
        ),
        (Limits(max_tools=1), chat(tools=[TOOL, TOOL]), "--max-tools"),
        (Limits(max_tool_schema_bytes=50), chat(tools=[TOOL]), "--max-tool-schema-bytes"),
        (Limits(max_json_depth=4), chat(chat_template_kwargs={"a": nested(5)}), "--max-json-depth"),
        (
            Limits(max_json_depth=4),
            chat(
                tools=[
                    {"type": "function", "function": {"name": "f", "parameters": {"a": nested(5)}}}
                ]
            ),
            "--max-json-depth",
        ),
        (
            Limits(max_images=1),
            chat(
                messages=[
                    {"role": "user", "content": [{"type": "image_url"}, {"type": "input_image"}]}
                ]
            ),
            "--max-images",
        ),
    ],
)
def test_each_limit_names_its_flag(
    limits: Limits, request_: ChatCompletionRequest, flag: str
) -> None:
    with pytest.raises(LimitExceeded) as info:
        limits.check_request(request_)
    assert flag in info.value.message
    assert info.value.status == 400


def test_within_limits_passes() -> None:
    Limits().check_request(chat(tools=[TOOL], chat_template_kwargs={"enable_thinking": False}))


def test_derender_bodies_check_the_request_they_carry() -> None:
    class Body(msgspec.Struct):
        chat_request: dict[str, Any]

    with pytest.raises(LimitExceeded, match="--max-messages"):
        Limits(max_messages=1).check_request(Body({"messages": [{}, {}]}))


def test_count_images_ignores_text_and_odd_shapes() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]},
        {"role": "user", "content": "plain"},
        "not a message",
    ]
    assert count_images(messages) == 1


@pytest.mark.parametrize("field", ["n", "priority", "seed", "top_logprobs"])
def test_integers_must_fit_int64(field: str) -> None:
    with pytest.raises(InvalidRequest, match="64-bit"):
        check_int64(chat(**{field: 2**63}))
    check_int64(chat(**{field: 2**63 - 1}))


def test_every_int_field_of_every_body_type_is_checked() -> None:
    """check_int64 reads only the fields whose annotation may hold an int (found once per type):
    each such field of each request body must be among them, and a big int in it refused."""
    import render_service.protocol as protocol_package
    from render_service.http.limits import _int_fields

    bodies = [
        t
        for module in pkgutil.iter_modules(protocol_package.__path__)
        for t in vars(importlib.import_module(f"render_service.protocol.{module.name}")).values()
        if isinstance(t, type) and issubclass(t, msgspec.Struct) and t.__name__.endswith("Request")
    ]
    assert ChatCompletionRequest in bodies
    for body in bodies:
        for field in msgspec.structs.fields(body):
            text = str(field.type)
            if text.startswith(("dict[", "list[")):  # containers: only the id lists are read
                continue
            if field.type is Any or re.search(r"(^|\| )(int|typing\.Annotated\[int)\b", text):
                assert field.name in _int_fields(body), (body.__name__, field.name)
    for field in _int_fields(ChatCompletionRequest):
        if field.endswith("_ids"):
            continue
        with pytest.raises(InvalidRequest, match="64-bit"):
            check_int64(msgspec.structs.replace(chat(), **{field: 2**63}))


def test_id_lists_must_fit_int64() -> None:
    with pytest.raises(InvalidRequest, match="stop_token_ids"):
        check_int64(chat(stop_token_ids=[1, -(2**63) - 1]))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model(tmp_path_factory.mktemp("model"))


def _request(path: str) -> Request:
    return Request(
        {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
    )


def test_request_timeout_is_a_clean_408_and_the_loop_keeps_serving(model_dir: Path) -> None:
    renderer = Renderer.from_pretrained(str(model_dir), request_timeout=0.05)
    service = build_app(renderer).state.service
    started = asyncio.Event()

    async def stuck(request: Request) -> Response:
        started.set()
        await asyncio.sleep(3600)
        return Response()

    async def quick(request: Request) -> Response:
        return Response(b"ok")

    async def scenario() -> tuple[Response, Response]:
        slow = await service.guarded(stuck)(_request("/v1/chat/completions/render"))
        fast = await service.guarded(quick)(_request("/v1/chat/completions/render"))
        return slow, fast

    slow, fast = asyncio.run(scenario())
    assert started.is_set()
    assert slow.status_code == 408
    error = msgspec.json.decode(slow.body)["error"]
    assert error["code"] == 408 and "--request-timeout" in error["message"]
    assert fast.status_code == 200
