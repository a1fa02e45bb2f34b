"""Server limits on request size and shape, checked once after decoding and before any real work.

Each violation is a 400 :class:`LimitExceeded` whose message names the flag that sets the limit,
so an operator reading a client's error knows which knob to turn. The limits are server policy,
not part of vLLM's contract; the library (``Renderer``) does not apply them. docs/security.md says
what each one protects.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

from render_service.errors import InvalidRequest, LimitExceeded, invalid_param
from render_service.protocol.chat import IMAGE_PART_TYPES
from render_service.settings import DEFAULTS, Settings

__all__ = ["Limits", "check_depth", "check_int64", "count_images"]

_encoder = msgspec.json.Encoder()
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_ID_LIST_FIELDS = frozenset({"stop_token_ids", "allowed_token_ids", "logprob_token_ids"})
# Fields that hold arbitrary JSON (dict[str, Any], Any): the only places deep nesting can hide.
_FREE_FORM_FIELDS = (
    "chat_template_kwargs",
    "response_format",
    "structured_outputs",
    "documents",
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
    "mm_processor_kwargs",
    "media_io_kwargs",
    "repetition_detection",
    "logit_bias",
    "chat_request",
    "completion_request",
    "messages_request",
    "responses_request",
    "input",
    "metadata",
    "stream_state",
    "prompt_logprobs",
)


def _free_form_fields(type_: type[Any]) -> tuple[str, ...]:
    """The free-form fields a body type has (found once per type, not per request)."""
    found = _FREE_FORM_BY_TYPE.get(type_)
    if found is None:
        fields = getattr(type_, "__struct_fields__", None)
        found = tuple(n for n in _FREE_FORM_FIELDS if fields is None or n in fields)
        _FREE_FORM_BY_TYPE[type_] = found  # one entry per body type: a bounded set
    return found


_FREE_FORM_BY_TYPE: dict[type[Any], tuple[str, ...]] = {}


def _exceeded(what: str, got: int, limit: int, flag: str, param: str) -> LimitExceeded:
    return LimitExceeded(f"{what} is {got}, over this server's limit of {limit} ({flag}).", param)


def check_depth(value: Any, limit: int, param: str) -> None:
    """LimitExceeded if lists/dicts nest deeper than ``limit`` (iterative: no recursion of our own).

    Walks one nesting level at a time, keeping only the containers of the next (~3x faster
    than a stack of (node, depth) pairs over a 40-message chat)."""
    if limit <= 0:
        return
    level = [value] if isinstance(value, (dict, list, tuple)) else []
    depth = 1
    while level:
        if depth > limit:
            raise LimitExceeded(
                f"JSON in '{param}' nests deeper than this server's limit of {limit} "
                "(--max-json-depth).",
                param,
            )
        below: list[Any] = []
        for node in level:
            for child in node.values() if isinstance(node, dict) else node:
                if isinstance(child, (dict, list)):
                    below.append(child)
        level = below
        depth += 1


def check_int64(body: msgspec.Struct) -> None:
    """Integer fields bound for the engine must fit its int64 (vLLM types seed and priority so);
    a client sending 2**70 gets a 400 here rather than an engine that cannot read the request."""
    for name in _int_fields(type(body)):
        value = getattr(body, name)
        if isinstance(value, int) and not isinstance(value, bool):
            if not _INT64_MIN <= value <= _INT64_MAX:
                raise _out_of_range(name, value)
        elif name in _ID_LIST_FIELDS and isinstance(value, list):
            for item in value:
                if isinstance(item, int) and not _INT64_MIN <= item <= _INT64_MAX:
                    raise _out_of_range(name, item)


def _int_fields(type_: type[msgspec.Struct]) -> tuple[str, ...]:
    """The fields of a body type that may hold an int or a list of ids, in order (found once
    per type: a chat request has 64 fields, 15 of them such)."""
    found = _INT_FIELDS_BY_TYPE.get(type_)
    if found is None:
        try:
            fields = msgspec.structs.fields(type_)
        except (NameError, TypeError):  # annotations that do not resolve: check every field
            found = tuple(type_.__struct_fields__)
        else:
            found = tuple(
                f.name for f in fields if f.name in _ID_LIST_FIELDS or _may_hold_int(f.type)
            )
        _INT_FIELDS_BY_TYPE[type_] = found  # one entry per body type: a bounded set
    return found


_INT_FIELDS_BY_TYPE: dict[type[msgspec.Struct], tuple[str, ...]] = {}


def _may_hold_int(type_: Any) -> bool:
    """False only for annotations that cannot hold an int (a str, float, bool, container or
    Struct field, a Literal of no ints); anything unrecognized counts as an int."""
    if type_ is Any or type_ is object:
        return True
    origin = get_origin(type_)
    if origin is Annotated:
        return _may_hold_int(get_args(type_)[0])
    if origin is Union or origin is types.UnionType:
        return any(_may_hold_int(arm) for arm in get_args(type_))
    if origin is Literal:
        return any(type(value) is int for value in get_args(type_))
    if origin in (list, dict, tuple, set, frozenset):
        return False
    if isinstance(type_, type) and origin is None:
        return issubclass(type_, int) and type_ is not bool
    return type_ is not type(None)


def _out_of_range(name: str, value: int) -> InvalidRequest:
    return invalid_param(f"{name} must fit in a signed 64-bit integer", name, value)


def count_images(messages: Iterable[Any]) -> int:
    """Image parts across all messages (a hook for the multimodal path)."""
    count = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            count += sum(
                1
                for part in content
                if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES
            )
    return count


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """The request-shape limits of one server; a value of 0 turns that check off."""

    max_messages: int = DEFAULTS["max_messages"]
    max_tools: int = DEFAULTS["max_tools"]
    max_tool_schema_bytes: int = DEFAULTS["max_tool_schema_bytes"]
    max_json_depth: int = DEFAULTS["max_json_depth"]
    max_images: int = DEFAULTS["max_images"]

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_messages=settings.max_messages,
            max_tools=settings.max_tools,
            max_tool_schema_bytes=settings.max_tool_schema_bytes,
            max_json_depth=settings.max_json_depth,
            max_images=settings.max_images,
        )

    def check_request(self, body: Any) -> None:
        """Checks for any request body: its numbers, messages, tools and free-form JSON fields."""
        check_int64(body)
        messages = getattr(body, "messages", None)
        if isinstance(messages, list):
            self.check_messages(messages)
        tools = getattr(body, "tools", None)
        if isinstance(tools, list) and tools:
            self.check_tools(tools)
        for name in _free_form_fields(type(body)):
            value = getattr(body, name, None)
            if isinstance(value, (dict, list)):
                check_depth(value, self.max_json_depth, name)
                if name.endswith("_request") and isinstance(value, dict):
                    self._check_embedded(value)
        for item in getattr(body, "items", None) or ():  # a multi-stream derender's streams
            if isinstance(item.stream_state, dict):
                check_depth(item.stream_state, self.max_json_depth, "stream_state")
            if item.prompt_tokens is not None:
                check_int64(item)

    def check_embedded(self, request: dict[str, Any]) -> None:
        """The checks ``check_request`` makes of a derender body's chat request, for one kept
        as raw JSON until it is used (render_service.derender.inputs)."""
        check_depth(request, self.max_json_depth, "chat_request")
        self._check_embedded(request)

    def _check_embedded(self, request: dict[str, Any]) -> None:
        """The chat or completion request a derender body carries."""
        messages = request.get("messages")
        if isinstance(messages, list):
            self.check_messages(messages)
        tools = request.get("tools")
        if isinstance(tools, list) and tools:
            self.check_tools(tools)

    def check_messages(self, messages: list[Any]) -> None:
        if self.max_messages and len(messages) > self.max_messages:
            raise _exceeded(
                "The number of messages",
                len(messages),
                self.max_messages,
                "--max-messages",
                "messages",
            )
        check_depth(messages, self.max_json_depth, "messages")
        if self.max_images:
            images = count_images(messages)
            if images > self.max_images:
                raise _exceeded(
                    "The number of images", images, self.max_images, "--max-images", "messages"
                )

    def check_tools(self, tools: list[Any]) -> None:
        if self.max_tools and len(tools) > self.max_tools:
            raise _exceeded(
                "The number of tools", len(tools), self.max_tools, "--max-tools", "tools"
            )
        # Depth first: to_builtins itself recurses, so it must only see bounded nesting.
        schemas = [
            tool.get("function") if isinstance(tool, dict) else getattr(tool, "function", None)
            for tool in tools
        ]
        check_depth(
            [getattr(s, "parameters", s) for s in schemas], self.max_json_depth - 2, "tools"
        )
        builtins = msgspec.to_builtins(tools)
        if self.max_tool_schema_bytes:
            size = len(_encoder.encode(builtins))
            if size > self.max_tool_schema_bytes:
                raise _exceeded(
                    "The JSON size of the tool definitions in bytes",
                    size,
                    self.max_tool_schema_bytes,
                    "--max-tool-schema-bytes",
                    "tools",
                )
