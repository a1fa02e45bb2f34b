"""Shared base classes and the one place where msgspec validation errors become SchemaErrors."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from render_service.errors import SchemaError

T = TypeVar("T")


class Body(msgspec.Struct, kw_only=True):
    """A request body: unknown fields are ignored, as vLLM's models allow extras."""


_PATH_SEGMENT = re.compile(r"\[(\d+)\]|\.([A-Za-z_][A-Za-z0-9_]*)|\[\'([^\']*)\'\]")


def _body_param(path: str) -> str:
    parts = ["body"]
    for index, name, key in _PATH_SEGMENT.findall(path.removeprefix("$")):
        parts.append(index or name or key)
    return ".".join(parts)


def schema_error(exc: msgspec.ValidationError) -> SchemaError:
    """Turn msgspec's message ``Expected `int`, got `str` - at `$.x`` into vLLM's shape."""
    text = str(exc)
    detail, _, where = text.rpartition(" - at `")
    if not detail:
        detail, where = text, "$`"
    param = _body_param(where.rstrip("`"))
    return SchemaError(f"1 validation error:\n  {{'loc': '{param}', 'msg': '{detail}'}}", param)


def decode_body(data: bytes | str, decoder: msgspec.json.Decoder[T]) -> T:
    """Decode a JSON body; schema and syntax errors become 400 SchemaErrors."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise schema_error(exc) from exc
    except msgspec.DecodeError as exc:
        raise SchemaError(
            f"1 validation error:\n  {{'type': 'json_invalid', 'loc': 'body', 'msg': 'JSON decode error: {exc}'}}",
            "body",
        ) from exc


def convert(value: Any, type_: type[T], path: str) -> T:
    """Validate an already-decoded value (e.g. a message dict) against a Struct type."""
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as exc:
        text = str(exc)
        detail, _, where = text.rpartition(" - at `")
        inner = where.rstrip("`").removeprefix("$") if detail else ""
        param = path + _body_param("$" + inner).removeprefix("body")
        raise SchemaError(
            f"1 validation error:\n  {{'loc': '{param}', 'msg': '{detail or text}'}}", param
        ) from exc
