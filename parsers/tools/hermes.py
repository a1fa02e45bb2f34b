"""Hermes tool calls: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (vLLM name `hermes`).

Format (Qwen2.5/Qwen3 chat templates, https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/tokenizer_config.json;
NousResearch Hermes-2-Pro function calling): one JSON object per call between the
`<tool_call>` and `</tool_call>` added tokens, repeatable. Argument text is scanned, not
parsed: a small JSON lexer tracks strings, escapes and nesting so that the value of
`"arguments"` (or `"parameters"`) is forwarded exactly as written, and ends exactly where
the value does. Nothing is held back; the state is a handful of flags plus the key or name
being read.
"""

from __future__ import annotations

import re
from typing import ClassVar

import msgspec

from parsers.events import Event, ToolArgsDelta, ToolCallEnd, ToolCallStart
from parsers.facts import TokenizerFacts
from parsers.family import FamilyState, Marker, ToolFamily
from parsers.request import ParseRequest
from parsers.structural_tag import TagSpelling, tool_tags_format

__all__ = ["HermesCall", "HermesConfig", "build", "scan_object"]

_TAGS = (
    TagSpelling(begin='<tool_call>\n{"name": "{name}", "arguments": ', end="}\n</tool_call>"),
    TagSpelling(begin='<tool_call>{"name": "{name}", "arguments": ', end="}</tool_call>"),
)

_OUTSIDE = 0  # before the object's "{"
_EXPECT_KEY = 1
_IN_KEY = 2
_EXPECT_COLON = 3
_EXPECT_VALUE = 4
_IN_NAME = 5
_IN_VALUE = 6
_AFTER_VALUE = 7
_DONE = 8  # object closed: the rest up to </tool_call> is ignored

_ARG_KEYS = ("arguments", "parameters")
_STRING_STOP = re.compile(r'["\\]')
_NESTED_STOP = re.compile(r'["{}\[\]]')
_SCALAR_STOP = re.compile(r"[,}\]\s]")
_WHITESPACE = " \t\r\n"


class HermesCall(FamilyState, frozen=True, tag="hermes", gc=False):
    """Lexer state inside one `<tool_call>`; bounded by the longest key or name."""

    index: int
    mode: int = _OUTSIDE
    text: str = ""  # raw key or name being read
    escaped: bool = False
    depth: int = 0  # nesting inside the current value
    in_string: bool = False  # inside a string within the current value
    capture: bool = False  # the current value is the arguments
    name: str | None = None
    started: bool = False
    early_args: str = ""  # arguments written before the name (kept until the name arrives)

    @property
    def closed(self) -> bool:
        """The object's closing brace was read."""
        return self.mode == _DONE


class HermesConfig(ToolFamily, frozen=True):
    """Marker ids of the Hermes format for one tokenizer."""

    start_id: int
    start_text: str
    end_id: int
    end_text: str
    family: str = "hermes"

    #: vLLM's adjust_request sets skip_special_tokens=False for this family.
    keeps_special_tokens: ClassVar[bool] = True

    def markers(self) -> tuple[Marker, ...]:
        """`<tool_call>` and `</tool_call>`."""
        return (
            Marker(self.start_id, self.start_text, "start"),
            Marker(self.end_id, self.end_text, "end"),
        )

    def structural_tag(self, request: ParseRequest, strict_level: str) -> str | None:
        """vLLM's `hermes` structural tag for this request, or None."""
        return tool_tags_format(_TAGS, self.start_text, request, strict_level)

    def begin(self, index: int) -> HermesCall:
        """State for a call that just opened; it will be call `index` if it gets a name."""
        return HermesCall(index=index)

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        """Scan more text of the call body."""
        if not isinstance(call, HermesCall):
            return call, []
        call, events, _ = scan_object(call, text)
        return call, events

    def close(self, call: FamilyState) -> list[Event]:
        """The call ended (closing token, or end of output): end it if it ever started."""
        if not isinstance(call, HermesCall):
            return []
        return [ToolCallEnd(call.index, complete=call.closed)] if call.started else []


def build(facts: TokenizerFacts) -> HermesConfig:
    """Hermes configuration for this tokenizer."""
    return HermesConfig(
        start_id=facts.marker_id("<tool_call>", "hermes"),
        start_text="<tool_call>",
        end_id=facts.marker_id("</tool_call>", "hermes"),
        end_text="</tool_call>",
    )


def scan_object(call: HermesCall, text: str) -> tuple[HermesCall, list[Event], int]:
    """Scan one JSON call object; also return where it stopped (just after its closing brace).

    Text after the closing brace is left unread; once closed, later text is ignored.
    """
    mode, raw, escaped = call.mode, call.text, call.escaped
    depth, in_string, capture = call.depth, call.in_string, call.capture
    name, started, early = call.name, call.started, call.early_args
    events: list[Event] = []
    args_parts: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if mode == _IN_VALUE:
            start = i
            i, depth, in_string, escaped, ended = _scan_value(text, i, depth, in_string, escaped)
            if capture and i > start:
                args_parts.append(text[start:i])
            if ended:
                mode = _AFTER_VALUE
            continue
        c = text[i]
        if mode in (_IN_KEY, _IN_NAME):
            j = i
            while j < n:
                ch = text[j]
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    break
                j += 1
            raw += text[i:j]
            i = j
            if j == n:
                break
            i += 1  # the closing quote
            if mode == _IN_KEY:
                mode = _EXPECT_COLON
                continue
            name = _decode_string(raw)
            mode, raw = _AFTER_VALUE, ""
            if not started:
                started = True
                events.append(ToolCallStart(call.index, name))
                if early:
                    events.append(ToolArgsDelta(call.index, early))
                    early = ""
            continue
        i += 1
        if c in _WHITESPACE or mode == _DONE:
            continue
        if mode == _OUTSIDE:
            if c == "{":
                mode = _EXPECT_KEY
        elif mode == _EXPECT_KEY:
            if c == '"':
                mode, raw = _IN_KEY, ""
            elif c == "}":
                mode = _DONE
        elif mode == _EXPECT_COLON:
            if c == ":":
                mode = _EXPECT_VALUE
        elif mode == _EXPECT_VALUE:
            if raw == "name" and c == '"' and name is None:
                mode, raw = _IN_NAME, ""
            else:
                capture = raw in _ARG_KEYS
                mode, raw, depth, in_string, escaped = _IN_VALUE, "", 0, False, False
                i -= 1  # the value's first character is scanned as part of the value
        elif mode == _AFTER_VALUE:
            if c == ",":
                mode = _EXPECT_KEY
            elif c == "}":
                mode = _DONE
        if mode == _DONE:
            break
    if args_parts:
        args = "".join(args_parts)
        if started:
            events.append(ToolArgsDelta(call.index, args))
        else:
            early += args
    new_call = HermesCall(
        index=call.index,
        mode=mode,
        text=raw,
        escaped=escaped,
        depth=depth,
        in_string=in_string,
        capture=capture,
        name=name,
        started=started,
        early_args=early,
    )
    return new_call, events, i


def _scan_value(
    text: str, i: int, depth: int, in_string: bool, escaped: bool
) -> tuple[int, int, bool, bool, bool]:
    """Advance over one JSON value; return (position, depth, in_string, escaped, ended)."""
    n = len(text)
    while i < n:
        if in_string:
            if escaped:
                escaped = False
                i += 1
                continue
            m = _STRING_STOP.search(text, i)
            if m is None:
                return n, depth, True, False, False
            i = m.end()
            if m.group() == "\\":
                escaped = True
                continue
            in_string = False
            if depth == 0:
                return i, depth, False, False, True
            continue
        if depth > 0:
            m = _NESTED_STOP.search(text, i)
            if m is None:
                return n, depth, False, False, False
            i = m.end()
            c = m.group()
            if c == '"':
                in_string = True
            elif c in "{[":
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    return i, 0, False, False, True
            continue
        c = text[i]
        if c == '"':
            in_string = True
            i += 1
        elif c in "{[":
            depth = 1
            i += 1
        else:
            # A bare scalar (number, true, false, null): it ends before a delimiter.
            m = _SCALAR_STOP.search(text, i)
            if m is None:
                return n, 0, False, False, False
            return m.start(), 0, False, False, True
    return i, depth, in_string, escaped, False


def _decode_string(raw: str) -> str:
    """The text of a JSON string body; kept as written if it does not decode."""
    if "\\" not in raw:
        return raw
    try:
        value = msgspec.json.decode(('"' + raw + '"').encode())
    except msgspec.DecodeError:
        return raw
    return value if isinstance(value, str) else raw
