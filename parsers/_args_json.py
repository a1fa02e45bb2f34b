"""Write a call's arguments as the JSON object vLLM 0.33 streams for key/value tool formats.

GLM and MiniMax write each argument as a key and a text value; vLLM joins them into
`{"key": value, ...}` with `json.dumps` spacing, each value typed by the tool's schema
(`parsers.schema_values`). What streams, and when, follows vLLM's prefix-safe streaming so that a
truncated or malformed call ends the same way:

* `"key": ` is written when the value opens; a value whose schema type is only "string" (or
  any value of a tool without a schema) streams as JSON string text as it arrives; any other
  value is held until it closes and then written typed;
* the closing quote of a string, or a typed value, waits until the next key or the call's
  end (vLLM streams the last value of the object only once something follows it);
* at the call's end the object is closed (`}`; `{}` with no arguments) unless a value is
  still open: then the text stops where it is, unterminated, as vLLM's stream does.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from parsers.schema_values import STRING, convert_value, schema_types

__all__ = ["ArgsWriter", "ToolSchemas", "tool_schemas"]

#: function name -> parameter name -> JSON types; None: the tool has no parameter schema.
ToolSchemas = dict[str, dict[str, frozenset[str]] | None]


def tool_schemas(tools: list[dict[str, Any]] | None) -> ToolSchemas:
    """Parameter types of each function tool of a request."""
    out: ToolSchemas = {}
    for tool in tools or []:
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        if not isinstance(properties, dict) or not properties:
            out.setdefault(function["name"], None)
            continue
        out.setdefault(function["name"], {k: schema_types(v) for k, v in properties.items()})
    return out


def json_string(text: str) -> str:
    """`text` as a JSON string literal, escaped as Python's json.dumps(ensure_ascii=False)."""
    return json.dumps(text, ensure_ascii=False)


class ArgsWriter(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """Where the JSON text of one call stands; at most one held typed value."""

    params: int = 0  # values opened so far
    pending: str = ""  # closing text of the last value, written with what follows
    open: bool = False  # a value is open
    stream: bool = False  # the open value streams as a JSON string
    types: frozenset[str] = STRING  # types of the open value when held
    held: str = ""  # text of the open held value

    def open_value(
        self, key: str, schema: dict[str, frozenset[str]] | None
    ) -> tuple[ArgsWriter, str]:
        """A value for `key` opens; returns the new writer and the text to stream."""
        # A parameter the schema does not list is held (vLLM streams only schema strings)
        # and stays a string.
        types = schema.get(key, STRING) if schema is not None else STRING
        stream = schema is None or (key in schema and types == STRING)
        head = self.pending + ("{" if self.params == 0 else ", ") + json_string(key) + ": "
        writer = ArgsWriter(params=self.params + 1, open=True, stream=stream, types=types)
        return writer, head + '"' if stream else head

    def value_text(self, text: str) -> tuple[ArgsWriter, str]:
        """More text of the open value."""
        if not self.open or not text:
            return self, ""
        if self.stream:
            return self, json_string(text)[1:-1]
        return msgspec.structs.replace(self, held=self.held + text), ""

    def close_value(self) -> ArgsWriter:
        """The open value ended; its closing text waits for what follows."""
        if not self.open:
            return self
        closing = '"' if self.stream else convert_value(self.held, self.types)
        return ArgsWriter(params=self.params, pending=closing)

    def end(self) -> str:
        """The call ended: the object's closing text, or "" while a value is still open."""
        if self.open:
            return ""
        return self.pending + ("}" if self.params else "{}")
