"""The one seam where msgspec's validation errors become vLLM's 400 ``SchemaError``.

Bodies are decoded (``decode_body``) and embedded values converted (``convert``) against the wire
Structs of ``render_service.protocol``; a mismatch reads as vLLM's pydantic error would.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
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


_MISSING = re.compile(r"^Object missing required field `([^`]+)`$")
#: Rewrites a schema error's param (e.g. to pydantic's union or tag path); gets the raw body.
ParamRemap = Callable[[str, bytes | str], str]


def schema_error(
    exc: msgspec.ValidationError, remap: ParamRemap | None = None, data: bytes | str = b""
) -> SchemaError:
    """Turn msgspec's message ``Expected `int`, got `str` - at `$.x`` into vLLM's shape."""
    text = str(exc)
    detail, _, where = text.rpartition(" - at `")
    if not detail:
        detail, where = text, "$`"
    param = _body_param(where.rstrip("`"))
    missing = _MISSING.match(detail)
    if missing:  # pydantic puts a missing field's own name in the loc
        param = f"{param}.{missing.group(1)}"
    if remap is not None:
        param = remap(param, data)
    return SchemaError(f"1 validation error:\n  {{'loc': '{param}', 'msg': '{detail}'}}", param)


def decode_body(
    data: bytes | str,
    decoder: msgspec.json.Decoder[T] | msgspec.msgpack.Decoder[T],
    remap: ParamRemap | None = None,
) -> T:
    """Decode a JSON (or msgpack) body; schema and syntax errors become 400 SchemaErrors."""
    try:
        return decoder.decode(data.encode() if isinstance(data, str) else data)
    except msgspec.ValidationError as exc:
        raise schema_error(exc, remap, data) from exc
    except msgspec.DecodeError as exc:
        offset = _json_error_offset(data)
        param = f"body.{offset}" if offset else "body"
        raise SchemaError(
            f"1 validation error:\n  {{'type': 'json_invalid', 'loc': '{param}', 'msg': 'JSON decode error: {exc}'}}",
            param,
        ) from exc


def _json_error_offset(data: bytes | str) -> str:
    """The character offset vLLM (FastAPI's json.loads) reports for a syntax error, if any."""
    try:
        json.loads(data)
    except json.JSONDecodeError as exc:
        return str(exc.pos)
    except (ValueError, RecursionError):
        return ""
    return ""


def decode_field(
    data: bytes, decoder: msgspec.json.Decoder[T] | msgspec.msgpack.Decoder[T], field: str
) -> T:
    """Decode one field of a body kept as raw JSON (``msgspec.Raw``): its errors read as they
    would had the whole body been decoded at once (``body.<field>...``)."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        detail, _, where = text.rpartition(" - at `")
        if not detail:
            detail, where = text, "$`"
        inner = where.rstrip("`").removeprefix("$")
        raise schema_error(msgspec.ValidationError(f"{detail} - at `$.{field}{inner}`")) from exc
    except msgspec.DecodeError as exc:  # msgpack only: JSON's syntax was checked with the body
        raise SchemaError(
            f"1 validation error:\n  {{'loc': 'body.{field}', 'msg': 'msgpack decode error: {exc}'}}",
            f"body.{field}",
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
