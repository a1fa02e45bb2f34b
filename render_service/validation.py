"""The one seam where msgspec's validation errors become vLLM's 400 ``SchemaError``.

Bodies are decoded (``decode_body``) and embedded values converted (``convert``) against the wire
Structs of ``render_service.protocol``; a mismatch reads as vLLM's pydantic error would.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from render_service.errors import SchemaError

T = TypeVar("T")

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


MAX_STOP_STRINGS = 4


def stop_strings(stop: str | list[str] | None) -> list[str]:
    """A request's ``stop`` as a list; more than vLLM's schema allows is its 400."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > MAX_STOP_STRINGS:
        raise SchemaError(
            f"1 validation error:\n  {{'type': 'too_long', 'loc': 'body.stop', 'msg': "
            f"'List should have at most {MAX_STOP_STRINGS} items after validation, not {len(stops)}'}}",
            "body.stop",
        )
    return stops
