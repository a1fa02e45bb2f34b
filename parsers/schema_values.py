"""Parameter values typed by the request's tool schema, as vLLM 0.33 converts them.

XML-style tool calls (Qwen3-Coder, GLM, MiniMax) write every parameter value as bare text;
vLLM turns each into the JSON value its schema allows (`coerce_to_schema_type` over the types
that `extract_types_from_schema` finds). The facts that matter for byte-equal arguments:

* types come from `type` (a string or a list), are inferred from `enum` values, and are
  collected through `anyOf`/`oneOf`/`allOf`; none found means `string`. Names are lowercased,
  stripped and mapped from common aliases (`int`, `float`, `bool`, `dict`, `list`, ...).
* conversion tries, in this order, whichever types are allowed: `null` (the text `null` in any
  case), `integer` (Python `int()`), `number` (`int()`, else a finite `float()`, integral floats
  becoming integers), `boolean` (`true`/`1`, `false`/`0`, any case, spaces ignored), `object` and
  `array` (finite JSON, of any kind), `string` (the text as is). When none applies, finite JSON
  of any kind is kept, else the text stays a string: `2.5` for an integer stays `2.5`, `three`
  stays `"three"`, a Python literal such as `{'a': None}` stays a string.
* values are serialized with `json.dumps(value, ensure_ascii=False)` (Python's float repr,
  `", "` and `": "` separators inside objects).

A parameter whose only type is `string` (or that the schema does not describe) streams as a
JSON string while it arrives; any other must be held until it is complete.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

__all__ = ["STRING", "convert_value", "schema_types", "tool_parameter_types"]

STRING = frozenset({"string"})

_ALIASES = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "int": "integer",
    "int32": "integer",
    "int64": "integer",
    "uint": "integer",
    "uint32": "integer",
    "uint64": "integer",
    "long": "integer",
    "short": "integer",
    "unsigned": "integer",
    "float": "number",
    "float32": "number",
    "float64": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "arr": "array",
    "list": "array",
    "sequence": "array",
}

_ENUM_TYPES: tuple[tuple[type, str], ...] = (
    (type(None), "null"),
    (bool, "boolean"),  # before int: bool is an int
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def schema_types(schema: Any) -> frozenset[str]:
    """The normalized JSON types a parameter schema allows (`string` when it says none)."""
    found = {_ALIASES.get(name, name) for name in _raw_types(schema)}
    return frozenset(found) if found else STRING


def _raw_types(schema: Any) -> Iterable[str]:
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    for name in [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []:
        if isinstance(name, str):
            yield name.strip().lower()
    enum = schema.get("enum")
    if isinstance(enum, list):
        for value in enum:
            yield next(name for cls, name in _ENUM_TYPES if isinstance(value, cls))
    for key in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(key)
        if isinstance(choices, list):
            for choice in choices:
                yield from _raw_types(choice)


def tool_parameter_types(
    tools: Iterable[Any] | None,
) -> dict[str, dict[str, frozenset[str]]]:
    """Function name -> parameter -> allowed types, for parameters that are not only strings.

    The first tool of a name wins; parameters the schema does not describe are strings.
    """
    typed: dict[str, dict[str, frozenset[str]]] = {}
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or str(function.get("name")) in typed:
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        kinds = {}
        if isinstance(properties, dict):
            kinds = {str(key): schema_types(value) for key, value in properties.items()}
        typed[str(function.get("name"))] = {k: t for k, t in kinds.items() if t != STRING}
    return typed


def convert_value(text: str, types: frozenset[str]) -> str:
    """The JSON text vLLM writes for a parameter value `text` of the given types."""
    if "null" in types and text.lower() == "null":
        return "null"
    if "integer" in types:
        try:
            return json.dumps(int(text))
        except ValueError:
            pass
    if "number" in types:
        number = _number(text)
        if number is not None:
            return json.dumps(number)
    if "boolean" in types:
        flag = text.strip().lower()
        if flag in ("true", "1"):
            return "true"
        if flag in ("false", "0"):
            return "false"
    if "object" in types or "array" in types:
        parsed = _finite_json(text)
        if parsed is not None:
            return parsed
    if "string" not in types:
        parsed = _finite_json(text)
        if parsed is not None:
            return parsed
    return json.dumps(text, ensure_ascii=False)


def _number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return int(value) if value == int(value) else value


def _finite_json(text: str) -> str | None:
    """`text` parsed as JSON and written back as vLLM writes it; None if invalid or not finite."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError):
        return None
