"""Qwen3-Coder XML tool calls (vLLM names `qwen3_coder`, `qwen3_xml`).

Format (Qwen3-Coder chat template, https://huggingface.co/Qwen/Qwen3-Coder-30B-A3B-Instruct/blob/main/chat_template.jinja)::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

`<tool_call>`/`</tool_call>` are added tokens (matched by id); the inner tags are plain text,
so a tail that may be the start of one is held back (at most `len("</parameter>")` chars).
Arguments stream as the JSON object vLLM builds, `{"KEY": VALUE, ...}`: one wrapping newline
is trimmed from each value; a parameter whose schema type is only "string" (or that has no
schema) streams as a JSON string as it arrives; any other is held until its closing tag and
then written as the model's own JSON text when it decodes to an allowed type, else as a string
(such a value is the one thing kept in the state).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from parsers.events import Event, ToolArgsDelta, ToolCallEnd, ToolCallStart
from parsers.facts import TokenizerFacts
from parsers.family import FamilyState, Marker, ReasoningFamily, ToolFamily
from parsers.request import ParseRequest

__all__ = ["XmlCall", "XmlConfig", "build"]

_PREAMBLE = 0  # before <function=
_NAME = 1  # reading the function name up to ">"
_BODY = 2  # between parameters
_PARAM_NAME = 3  # reading a parameter name up to ">"
_VALUE = 4  # reading a parameter value
_AFTER = 5  # after </function>

_FUNC = "<function="
_FUNC_END = "</function>"
_PARAM = "<parameter="
_PARAM_END = "</parameter>"
_VALUE_ENDS = (_PARAM_END, _PARAM, _FUNC_END)

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


class XmlCall(FamilyState, frozen=True, tag="xml", gc=False):
    """State inside one `<tool_call>`; holds at most one partial tag or one typed value."""

    index: int
    mode: int = _PREAMBLE
    held: str = ""  # partial tag, or function/parameter name being read
    name: str = ""
    started: bool = False
    params: int = 0  # parameters written so far
    typed: tuple[str, ...] = ()  # allowed JSON types of the current value; () streams a string
    at_value_start: bool = True
    newline_held: bool = False  # a trailing "\n" that may be the wrapping newline
    value: str = ""  # a typed (non-string) value, collected until its closing tag


class XmlConfig(ToolFamily, frozen=True):
    """Marker ids plus, once bound to a request, the non-string parameter types per function."""

    start_id: int
    start_text: str
    end_id: int
    end_text: str
    family: str = "qwen3_coder"
    typed_params: dict[str, dict[str, tuple[str, ...]]] = msgspec.field(default_factory=dict)

    #: vLLM's adjust_request sets skip_special_tokens=False for this family.
    keeps_special_tokens: ClassVar[bool] = True

    def markers(self) -> tuple[Marker, ...]:
        """`<tool_call>` and `</tool_call>`; the inner tags are plain text."""
        return (
            Marker(self.start_id, self.start_text, "start"),
            Marker(self.end_id, self.end_text, "end"),
        )

    def bind(self, request: ParseRequest, reasoning: ReasoningFamily | None) -> XmlConfig:
        """This config with the request's tool schemas."""
        typed: dict[str, dict[str, tuple[str, ...]]] = {}
        for tool in request.tools or []:
            function = tool.get("function") or {}
            properties = (function.get("parameters") or {}).get("properties") or {}
            types = {k: _schema_types(v) for k, v in properties.items() if isinstance(v, dict)}
            typed[str(function.get("name"))] = {k: t for k, t in types.items() if t != ("string",)}
        return msgspec.structs.replace(self, typed_params=typed)

    def structural_tag(self, request: ParseRequest, strict_level: str) -> str | None:
        """Not produced yet: vLLM uses xgrammar's `qwen_3_coder` template (see docs/compat.md)."""
        return None

    def begin(self, index: int) -> XmlCall:
        """State for a call that just opened."""
        return XmlCall(index=index)

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        """Scan more text of the call body."""
        if not isinstance(call, XmlCall):
            return call, []
        out = _Out(call.index, call.started)
        call = self._scan(call, call.held + text, out)
        return call, out.events()

    def close(self, call: FamilyState) -> list[Event]:
        """End the call: finish an open value and the object, as if the tags had closed."""
        if not isinstance(call, XmlCall) or not (call.started or call.mode == _NAME):
            return []
        out = _Out(call.index, call.started)
        if call.mode == _NAME:
            call = self._named(call, call.held, out)
        if call.mode == _VALUE:
            call = self._end_value(call, call.value + call.held, out)
        if call.mode != _AFTER:
            out.args("}" if call.params else "{}")
        out.flush()
        out.items.append(ToolCallEnd(call.index))
        return out.events()

    def _scan(self, call: XmlCall, text: str, out: _Out) -> XmlCall:
        rep = msgspec.structs.replace
        call = rep(call, held="")
        while text:
            mode = call.mode
            if mode == _AFTER:
                return call
            if mode in (_NAME, _PARAM_NAME):
                end = text.find(">")
                if end < 0:
                    return rep(call, held=text)
                name, text = text[:end].strip(), text[end + 1 :]
                call = (
                    self._named(call, name, out) if mode == _NAME else self._param(call, name, out)
                )
                continue
            if mode == _VALUE:
                call, text = self._value(call, text, out)
                continue
            wanted = (_FUNC,) if mode == _PREAMBLE else (_PARAM, _FUNC_END)
            found, at, tag = _find_first(text, wanted)
            if not found:
                return rep(call, held=text[at:])  # maybe the start of a tag
            text = text[at + len(tag) :]
            if tag == _FUNC:
                call = rep(call, mode=_NAME)
            elif tag == _PARAM:
                call = rep(call, mode=_PARAM_NAME)
            else:
                out.args("}" if call.params else "{}")
                call = rep(call, mode=_AFTER)
        return call

    def _named(self, call: XmlCall, name: str, out: _Out) -> XmlCall:
        if not call.started:
            out.start(name)
        return msgspec.structs.replace(call, mode=_BODY, name=name, started=True, held="")

    def _param(self, call: XmlCall, key: str, out: _Out) -> XmlCall:
        out.args(("{" if call.params == 0 else ", ") + _json_string(key) + ": ")
        typed = self.typed_params.get(call.name, {}).get(key, ())
        if not typed:
            out.args('"')
        return msgspec.structs.replace(
            call, mode=_VALUE, params=call.params + 1, typed=typed, at_value_start=True,
            newline_held=False,
        )  # fmt: skip

    def _value(self, call: XmlCall, text: str, out: _Out) -> tuple[XmlCall, str]:
        found, at, tag = _find_first(text, _VALUE_ENDS)
        piece = text[:at]
        if not found:
            return self._more_value(call, piece, text[at:], out), ""
        call = self._end_value(call, call.value + piece, out)
        if tag == _PARAM_END:
            return call, text[at + len(tag) :]
        return call, text[at:]  # the next tag is handled in the body

    def _more_value(self, call: XmlCall, piece: str, tail: str, out: _Out) -> XmlCall:
        rep = msgspec.structs.replace
        if call.typed:
            return rep(call, value=call.value + piece, held=tail)
        if call.at_value_start and piece:
            piece = piece.removeprefix("\n")
            call = rep(call, at_value_start=False)
        if call.newline_held:
            piece = "\n" + piece
        held_nl = piece.endswith("\n")
        if held_nl:
            piece = piece[:-1]
        if piece:
            out.args(_json_string(piece)[1:-1])
        return rep(call, held=tail, newline_held=held_nl)

    def _end_value(self, call: XmlCall, piece: str, out: _Out) -> XmlCall:
        if call.typed:
            value = _trim(piece)
            out.args(_typed_json(value, call.typed))
        else:
            if call.at_value_start:
                piece = piece.removeprefix("\n")
            if call.newline_held:
                piece = "\n" + piece
            piece = piece.removesuffix("\n")
            out.args(_json_string(piece)[1:-1] + '"')
        return msgspec.structs.replace(
            call, mode=_BODY, held="", typed=(), newline_held=False, value=""
        )


class _Out:
    """Collects events for one feed, joining argument pieces."""

    def __init__(self, index: int, started: bool) -> None:
        self.index, self.started = index, started
        self.items: list[Event] = []
        self.pending: list[str] = []

    def start(self, name: str) -> None:
        self.items.append(ToolCallStart(self.index, name))
        self.started = True

    def args(self, text: str) -> None:
        self.pending.append(text)

    def flush(self) -> None:
        if self.pending and self.started:
            self.items.append(ToolArgsDelta(self.index, "".join(self.pending)))
        self.pending = []

    def events(self) -> list[Event]:
        self.flush()
        return self.items


def build(facts: TokenizerFacts) -> XmlConfig:
    """Qwen3-Coder configuration for this tokenizer."""
    return XmlConfig(
        start_id=facts.marker_id("<tool_call>", "qwen3_coder"),
        start_text="<tool_call>",
        end_id=facts.marker_id("</tool_call>", "qwen3_coder"),
        end_text="</tool_call>",
    )


def _find_first(text: str, tags: tuple[str, ...]) -> tuple[bool, int, str]:
    """First complete tag in `text`; else (False, start of a possible partial tag, "")."""
    best, best_tag = -1, ""
    for tag in tags:
        at = text.find(tag)
        if at >= 0 and (best < 0 or at < best):
            best, best_tag = at, tag
    if best >= 0:
        return True, best, best_tag
    # Hold back the shortest tail that could still grow into one of the tags.
    for start in range(max(0, len(text) - max(map(len, tags)) + 1), len(text)):
        tail = text[start:]
        if any(tag.startswith(tail) for tag in tags):
            return False, start, ""
    return False, len(text), ""


def _schema_types(schema: dict[str, Any]) -> tuple[str, ...]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return (kind,)
    if isinstance(kind, list):
        return tuple(str(k) for k in kind)
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return ("string",)
    return ("string",) if not schema else ("object", "array", "string")


def _trim(value: str) -> str:
    return value.removeprefix("\n").removesuffix("\n")


def _json_string(text: str) -> str:
    return msgspec.json.encode(text).decode()


def _typed_json(value: str, types: tuple[str, ...]) -> str:
    """The model's own text if it is JSON of an allowed type; otherwise a JSON string."""
    allowed = tuple(t for name in types for t in _JSON_TYPES.get(name, ()))
    try:
        decoded = msgspec.json.decode(value.strip().encode())
    except msgspec.DecodeError:
        return _json_string(value)
    if isinstance(decoded, bool) and bool not in allowed:
        return _json_string(value)
    if isinstance(decoded, allowed):
        return value.strip()
    return _json_string(value)
