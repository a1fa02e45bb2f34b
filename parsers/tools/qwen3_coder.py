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
As in vLLM 0.33 (its parser-engine grammar for Qwen3):

* the whole answer is read by this family: text is content, except that `<function=` also
  opens a call without `<tool_call>`; text after `</tool_call>` is content again;
* text before `<function=` inside `<tool_call>`, and after `</function>` up to `</tool_call>`,
  is dropped (also after a call that had no `<tool_call>`); another `<function=` there starts
  another call;
* arguments stream as the JSON object vLLM builds, `{"KEY": VALUE, ...}`: one wrapping newline
  is trimmed from each value; a value typed only "string" by the tool schema (or not in it)
  streams as a JSON string as it arrives; any other is held until its closing tag and then
  converted as vLLM converts it (`parsers.schema_values`);
* a call cut by the end of the output inside a value stays as streamed (the JSON unterminated);
  cut elsewhere, its object is closed.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from parsers.events import ContentDelta, Event, ToolArgsDelta, ToolCallEnd, ToolCallStart
from parsers.facts import TokenizerFacts
from parsers.family import FamilyState, Marker, ReasoningFamily, ToolFamily
from parsers.request import ParseRequest
from parsers.schema_values import convert_value, tool_parameter_types
from parsers.structural_tag import TagSpelling, json_call_format

__all__ = ["XmlCall", "XmlConfig", "build"]

_PREAMBLE = 0  # after <tool_call>, before <function=
_NAME = 1  # reading the function name up to ">"
_BODY = 2  # between parameters
_PARAM_NAME = 3  # reading a parameter name up to ">"
_VALUE = 4  # reading a parameter value
_AFTER = 5  # after </function>, before </tool_call>
_CONTENT = 6  # answer text outside <tool_call>

_FUNC = "<function="
_FUNC_END = "</function>"
_PARAM = "<parameter="
_PARAM_END = "</parameter>"
_VALUE_ENDS = (_PARAM_END, _PARAM, _FUNC_END)
_BODY_TAGS = (_PARAM, _FUNC_END, _FUNC)
_FUNC_ONLY = (_FUNC,)

# xgrammar's builtin `qwen_3_coder` template, as vLLM 0.33 renders it.
_TAG = TagSpelling(begin="<tool_call>\n<function={name}>\n", end="\n</function>\n</tool_call>")
_TRIGGER = "<tool_call>\n<function="
_EXCLUDES = ("<think>", "</think>")

_encode = msgspec.json.encode


class XmlCall(FamilyState, frozen=True, tag="xml", gc=False):
    """State of the answer or of one `<tool_call>`; holds at most one partial tag or typed value."""

    index: int
    mode: int = _PREAMBLE
    held: str = ""  # partial tag, or function/parameter name being read
    name: str = ""
    started: bool = False
    params: int = 0  # parameters written so far
    typed: frozenset[str] = frozenset()  # types of the current value; empty streams a string
    at_value_start: bool = True
    newline_held: bool = False  # a trailing "\n" that may be the wrapping newline
    value: str = ""  # a typed value, collected until its closing tag


class XmlConfig(ToolFamily, frozen=True):
    """Marker ids plus, once bound to a request, the non-string parameter types per function."""

    start_id: int
    start_text: str
    end_id: int
    end_text: str
    family: str = "qwen3_coder"
    typed_params: dict[str, dict[str, frozenset[str]]] = msgspec.field(default_factory=dict)

    #: vLLM's adjust_request sets skip_special_tokens=False for this family.
    keeps_special_tokens: ClassVar[bool] = True
    #: Text after a call is content (vLLM's engine streams it).
    drops_text_after_calls: ClassVar[bool] = False
    #: With calls off, vLLM's engine still reads `<tool_call>` markup and drops it.
    swallows_inactive_markup: ClassVar[bool] = True
    #: vLLM 0.33 runs this family on its parser engine (the `Qwen3Parser` grammar).
    engine: ClassVar[bool] = True

    def markers(self) -> tuple[Marker, ...]:
        """`<tool_call>` and `</tool_call>`; the inner tags are plain text."""
        return (
            Marker(self.start_id, self.start_text, "start"),
            Marker(self.end_id, self.end_text, "end"),
        )

    def bind(self, request: ParseRequest, reasoning: ReasoningFamily | None) -> XmlConfig:
        """This config with the request's tool schemas."""
        return msgspec.structs.replace(self, typed_params=tool_parameter_types(request.tools))

    def structural_tag(self, request: ParseRequest, strict_level: str) -> str | None:
        """vLLM's tag from xgrammar's `qwen_3_coder` template for this request, or None."""
        return json_call_format(
            _TAG, _TRIGGER, list(_EXCLUDES), request, strict_level, style="qwen_xml"
        )

    def start_is_text(self, call: FamilyState) -> bool:
        """`<tool_call>` inside a function body is text, as vLLM's grammar reads it there."""
        return isinstance(call, XmlCall) and call.mode in (_PREAMBLE, _BODY, _PARAM_NAME, _VALUE)

    def begin(self, index: int) -> XmlCall:
        """State for a call that just opened (`<tool_call>`)."""
        return XmlCall(index=index)

    def begin_answer(self, index: int) -> XmlCall:
        """The answer (or text after a call) starts: content until `<function=`."""
        return XmlCall(index=index, mode=_CONTENT)

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        """Scan more text of the answer or of a call."""
        if not isinstance(call, XmlCall):
            return call, []
        if not call.held and "<" not in text:
            mode = call.mode
            if mode == _VALUE and not (call.typed or call.at_value_start or call.newline_held):
                if not text.endswith("\n"):  # the per-token hot path inside a string value
                    return call, [ToolArgsDelta(call.index, _encode(text).decode()[1:-1])]
            elif mode == _CONTENT:
                return call, [ContentDelta(text)]
        out = _Out(call.index, call.started)
        call = self._scan(call, call.held + text, out)
        return call, out.events()

    def close(self, call: FamilyState) -> list[Event]:
        """End of the call or output: close the object unless cut inside a value."""
        if not isinstance(call, XmlCall):
            return []
        out = _Out(call.index, call.started)
        if call.mode == _CONTENT:
            if call.held:
                out.items.append(ContentDelta(call.held))
            return out.items
        if call.mode == _NAME:
            call = self._named(call, call.held, out)
        if not call.started or call.mode == _AFTER:
            return out.events()  # never named, or ended at </function>
        if call.mode != _VALUE:
            out.args("}" if call.params else "{}")
        out.flush()
        out.items.append(ToolCallEnd(call.index))
        return out.events()

    def _scan(self, call: XmlCall, text: str, out: _Out) -> XmlCall:
        rep = msgspec.structs.replace
        call = rep(call, held="")
        while text:
            mode = call.mode
            if mode in (_NAME, _PARAM_NAME):
                end = text.find(">")
                if end < 0:
                    return rep(call, held=text)
                name, text = text[:end], text[end + 1 :]
                if mode == _PARAM_NAME:
                    call = self._param(call, name, out)
                elif name.endswith(_FUNC_END[:-1]):  # `<function=NAME</function>`: no body
                    call = self._named(call, name[: -len(_FUNC_END) + 1], out)
                    out.args("{}")
                    out.end()
                    call = rep(call, mode=_AFTER)
                else:
                    call = self._named(call, name, out)
                continue
            if mode == _VALUE:
                call, text = self._value(call, text, out)
                continue
            wanted = _BODY_TAGS if mode == _BODY else _FUNC_ONLY
            found, at, tag = _find_first(text, wanted)
            if mode == _CONTENT and at:
                out.content(text[:at])
            if not found:
                return rep(call, held=text[at:])  # maybe the start of a tag
            text = text[at + len(tag) :]
            if tag == _FUNC:
                call = self._function(call, out)
            elif tag == _PARAM:
                call = rep(call, mode=_PARAM_NAME)
            else:
                out.args("}" if call.params else "{}")
                out.end()
                call = rep(call, mode=_AFTER)
        return call

    def _function(self, call: XmlCall, out: _Out) -> XmlCall:
        """`<function=`: a new call, ending the one in progress (vLLM starts another)."""
        if call.started:
            if call.mode == _BODY:
                out.args("}" if call.params else "{}")
                out.end()
            call = XmlCall(index=call.index + 1)
        return msgspec.structs.replace(call, mode=_NAME)

    def _named(self, call: XmlCall, name: str, out: _Out) -> XmlCall:
        name = name.strip()
        if not call.started:
            out.start(call.index, name)
        return msgspec.structs.replace(call, mode=_BODY, name=name, started=True, held="")

    def _param(self, call: XmlCall, key: str, out: _Out) -> XmlCall:
        out.args(("{" if call.params == 0 else ", ") + _encode(key).decode() + ": ")
        typed = self.typed_params.get(call.name, {}).get(key, frozenset())
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
            out.args(_encode(piece).decode()[1:-1])
        return rep(call, held=tail, newline_held=held_nl)

    def _end_value(self, call: XmlCall, piece: str, out: _Out) -> XmlCall:
        if call.typed:
            out.args(convert_value(piece.removeprefix("\n").removesuffix("\n"), call.typed))
        else:
            if call.at_value_start:
                piece = piece.removeprefix("\n")
            if call.newline_held:
                piece = "\n" + piece
            piece = piece.removesuffix("\n")
            out.args(_encode(piece).decode()[1:-1] + '"')
        return msgspec.structs.replace(
            call, mode=_BODY, held="", typed=frozenset(), newline_held=False, value=""
        )


class _Out:
    """Collects events for one feed, joining argument pieces of the current call."""

    def __init__(self, index: int, started: bool) -> None:
        self.index, self.started = index, started
        self.items: list[Event] = []
        self.pending: list[str] = []

    def content(self, text: str) -> None:
        self.items.append(ContentDelta(text))

    def start(self, index: int, name: str) -> None:
        self.flush()
        self.index, self.started = index, True
        self.items.append(ToolCallStart(index, name))

    def args(self, text: str) -> None:
        self.pending.append(text)

    def end(self) -> None:
        self.flush()
        self.items.append(ToolCallEnd(self.index))
        self.started = False

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
    lt = text.find("<", max(0, len(text) - max(map(len, tags)) + 1))
    while lt >= 0:
        tail = text[lt:]
        if any(tag.startswith(tail) for tag in tags):
            return False, lt, ""
        lt = text.find("<", lt + 1)
    return False, len(text), ""
