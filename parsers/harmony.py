"""Harmony (gpt-oss): a token-level protocol of messages, parsed as a value-in value-out machine.

The model writes messages ``<|start|>ROLE<|channel|>CHANNEL [to=RECIPIENT] [<|constrain|>TYPE]
<|message|>TEXT<|end|>`` (or ``<|call|>`` after a tool call, ``<|return|>`` after the answer); the
first header's role is the prompt's (it ends with ``<|start|>assistant``). Format:
https://cookbook.openai.com/articles/openai-harmony.

What a message becomes follows vLLM 0.33.0's gpt-oss path (`HarmonyParser` over oss-harmony's
`StreamableParser`, which it feeds every output id): ``analysis`` is reasoning, ``final`` and
``commentary`` without a recipient are content, a recipient that names a function
(``functions.NAME``, or any name that is not a built-in tool) is a tool call whose arguments are
the text as written; built-in tools (``browser``, ``python``, ``container``) and unknown channels are
dropped, except that an ``analysis`` message stays reasoning. Headers are parsed like
`StreamableParser` does, errors included: a header that does not parse drops its message, ids
between messages that are not ``<|start|>`` are dropped, and an output that ends inside a header
becomes content (the raw text since the last message). Where we differ (docs/compat.md): messages
not written by the assistant are dropped, a message's unfinished character is flushed as U+FFFD
(streaming then equals batch), and a header longer than `MAX_HEADER_BYTES` stops the parsing: the
rest of the output is content as written.

The state holds the open message's kind, the bytes of an unfinished character and at most
`MAX_HEADER_BYTES` of text since the last message (the open header): never the history.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar, Final

import msgspec

from parsers.errors import ParserConfigError, UnsupportedModelError
from parsers.events import (
    ContentDelta,
    Event,
    ReasoningDelta,
    ToolArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from parsers.facts import TokenizerFacts
from parsers.family import ChatFamily, Family, FamilyState
from parsers.request import ParseRequest
from parsers.structural_tag import RenderAdjustments, constrained_functions, json_content

__all__ = [
    "MAX_HEADER_BYTES",
    "HarmonyConfig",
    "HarmonyFamily",
    "HarmonyHeader",
    "HarmonyState",
    "build",
    "harmony_output_tag",
    "harmony_tools_format",
    "harmony_tools_tag",
    "parse_header",
]

#: Header bytes kept before the output is taken as not Harmony (real headers are under 100).
MAX_HEADER_BYTES: Final = 256

# Modes.
EXPECT_START: Final = 0
HEADER: Final = 1
BODY: Final = 2
RAW: Final = 3

# What the open message's text is.
DROP: Final = 0
REASONING: Final = 1
CONTENT: Final = 2
TOOL: Final = 3

_ROLES: Final = frozenset({"user", "assistant", "system", "developer", "tool"})
_BUILTIN_TOOLS: Final = frozenset({"python", "browser", "container"})
_CHANNEL: Final = "<|channel|>"
_CONSTRAIN: Final = "<|constrain|>"
# Rust's `char::is_whitespace` (Unicode White_Space) and `is_ascii_whitespace`: StreamableParser
# trims and splits with these, which differ from Python's str.strip()/split().
_WHITE_SPACE: Final = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_ASCII_WHITE_SPACE_RUN: Final = re.compile("[ \t\n\x0c\r]+")


class HarmonyHeader(msgspec.Struct, frozen=True, gc=False):
    """A parsed message header: author, channel, recipient and content type."""

    role: str
    name: str | None = None
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None


def _split_ascii_whitespace(text: str) -> list[str]:
    return [part for part in _ASCII_WHITE_SPACE_RUN.split(text) if part]


def parse_header(text: str, role: str | None) -> HarmonyHeader | None:
    """Parse header text the way `StreamableParser` does; None where it raises.

    `role` is the role the prompt implies for this message (the first one), else None and the
    header must name it. An unknown role followed by more parts is a tool's name.
    """
    channel: str | None = None
    at = text.find(_CHANNEL)
    while at >= 0:
        # The first channel counts (it must not be empty); later ones are cut out with their value.
        after = text[at + len(_CHANNEL) :]
        end = len(after)
        for i, ch in enumerate(after):
            if ch in _WHITE_SPACE or ch == "<":
                end = i
                break
        if channel is None:
            if end == 0:
                return None
            channel = after[:end]
        text = text[:at] + after[end:]
        at = text.find(_CHANNEL)
    text = text.strip(_WHITE_SPACE)
    if _CONSTRAIN in text:
        text = text.replace(_CONSTRAIN, " " + _CONSTRAIN).strip(_WHITE_SPACE)
    parts = _split_ascii_whitespace(text)
    name: str | None = None
    if role is None:
        if not parts:
            return None
        named = parts[0]
        name = named
        if named in _ROLES:
            role = named
        elif len(parts) > 1 or named.startswith("to="):
            parts.pop(0)
            role = "tool"
        else:
            return None
    if parts and parts[0] == role:
        parts.pop(0)
    recipient: str | None = None
    content_type: str | None = None
    if parts:
        count = len(parts)
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif count == 1:
            recipient = last
        else:
            content_type = last
            if parts:
                raw = parts.pop()
                recipient = raw[3:] if raw.startswith("to=") else raw
        if parts:
            return None
    return HarmonyHeader(
        role=role,
        name=name if role == "tool" else None,
        channel=channel,
        recipient=recipient,
        content_type=content_type,
    )


def _normalize_recipient(recipient: str | None) -> str | None:
    """vLLM cuts a `<|constrain|>` that older Harmony parsed into the recipient."""
    if recipient is None:
        return None
    at = recipient.find(_CONSTRAIN)
    if at < 0:
        return recipient
    return recipient[:at].rstrip() or None


def _is_function(recipient: str) -> bool:
    """vLLM's chat rule: any recipient but the assistant, markup and built-in tools is a function."""
    if not recipient or recipient.startswith("<|"):
        return False
    if recipient.startswith("functions."):
        return len(recipient) > len("functions.")
    if recipient == "assistant":
        return False
    return recipient.split(".", 1)[0] not in _BUILTIN_TOOLS


def message_kind(header: HarmonyHeader) -> int:
    """What the message's text is: reasoning, content, a tool call's arguments, or dropped."""
    if header.role != "assistant":
        return DROP
    recipient = _normalize_recipient(header.recipient)
    if recipient is not None and _is_function(recipient):
        return TOOL
    if header.channel == "analysis":
        return REASONING
    if header.channel == "final" or (header.channel == "commentary" and recipient is None):
        return CONTENT
    return DROP


def _take_text(pending: bytes) -> tuple[str, bytes]:
    """Decode like StreamableParser per id: the valid prefix, one U+FFFD for one bad sequence.

    Returns the text and the bytes still held (an unfinished character, or what follows a bad
    sequence: StreamableParser reads those with the next id).
    """
    try:
        return pending.decode(), b""
    except UnicodeDecodeError as exc:
        text = pending[: exc.start].decode()
        if exc.end >= len(pending) and exc.reason == "unexpected end of data":
            return text, pending[exc.start :]
        return text + "\ufffd", pending[exc.end :]


class HarmonyState(FamilyState, frozen=True, tag="harmony", gc=False):
    """A Harmony stream between chunks. New fields go last, with defaults."""

    mode: int = HEADER
    #: No header has parsed yet: the next one may leave out the role (it is the assistant).
    first: bool = True
    #: Bytes of the ids since the last finished message: an output ending in a header shows them.
    raw: bytes = b""
    #: Where the open header starts in `raw`.
    header_at: int = 0
    #: The open message's kind (BODY mode).
    kind: int = DROP
    #: Bytes of an unfinished character (BODY and RAW modes).
    pending: bytes = b""
    #: Tool calls started so far (the next call's index).
    tools_started: int = 0

    @property
    def tools_emitted(self) -> bool:
        """Whether any tool call was emitted (finish_reason "tool_calls")."""
        return self.tools_started > 0


class HarmonyConfig(msgspec.Struct, frozen=True):
    """Per-model constants: the framing token ids and every id's bytes."""

    start_id: int
    message_id: int
    #: <|end|>, <|return|>, <|call|>: they close a message (StreamableParser's stop tokens).
    stop_ids: frozenset[int]
    #: The bytes each id stands for (special tokens: their spelling); ids past the end have none.
    token_bytes: Sequence[bytes]

    @classmethod
    def build(cls, facts: TokenizerFacts, token_bytes: Sequence[bytes]) -> HarmonyConfig:
        """Read the framing ids from the tokenizer; `token_bytes[i]` is id i's bytes."""
        ids = {
            text: facts.marker_id(text, "harmony")
            for text in ("<|start|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")
        }
        if len(token_bytes) <= max(ids.values()):
            raise UnsupportedModelError("harmony needs the bytes of every framing token")
        return cls(
            start_id=ids["<|start|>"],
            message_id=ids["<|message|>"],
            stop_ids=frozenset((ids["<|end|>"], ids["<|return|>"], ids["<|call|>"])),
            token_bytes=token_bytes,
        )


def build(facts: TokenizerFacts) -> HarmonyFamily:
    """The registry's constructor: needs the tokenizer's per-id bytes (`facts.token_bytes`)."""
    return HarmonyFamily(HarmonyConfig.build(facts, facts.token_bytes))


class HarmonyFamily(ChatFamily, frozen=True):
    """Harmony as a chat family: `start`, `feed` and `finish` over a `HarmonyState`.

    Registered as the `openai_gptoss` reasoning parser and the `openai` tool parser; `bind` sets
    the switches for one request. `reasoning`: analysis text is reported (a reasoning parser is
    set and the request includes reasoning). `tools`: tool calls are reported (a tool parser is
    set and vLLM keeps the request's calls); otherwise they are dropped, never content.
    """

    #: vLLM's Harmony batch path takes a recipient's message as the arguments, as written.
    validates_arguments: ClassVar[bool] = False

    config: HarmonyConfig
    reasoning: bool = True
    tools: bool = False
    #: The bound request, and whether a tool parser is set (its structural tag applies).
    request: ParseRequest | None = None
    tool_parser: bool = False

    def bind(
        self, request: ParseRequest, reasoning: Family | None, tools: Family | None
    ) -> HarmonyFamily:
        for family in (reasoning, tools):
            if family is not None and not isinstance(family, HarmonyFamily):
                raise ParserConfigError(
                    f"Harmony output needs the openai_gptoss and openai parsers, not "
                    f"{type(family).__name__}"
                )
        choice = request.effective_tool_choice
        keeps = choice in ("required", "named") or (choice == "auto" and bool(request.tools))
        return HarmonyFamily(
            self.config,
            reasoning=reasoning is not None and request.include_reasoning,
            tools=tools is not None and keeps,
            request=request,
            tool_parser=tools is not None,
        )

    def reasoning_ended(self, prompt_token_ids: Sequence[int]) -> bool | None:
        """vLLM's gpt-oss reasoning parser reports reasoning as ended for every prompt."""
        return True

    def render_adjustments(self, strict_level: str) -> RenderAdjustments:
        """The tool-call structural tag (render adds the structured-outputs one itself:
        `harmony_output_tag`, `harmony_tools_tag`)."""
        if not self.tool_parser or self.request is None:
            return RenderAdjustments()
        return RenderAdjustments(structural_tag=harmony_tools_tag(None, self.request, strict_level))

    def marker_ids(self) -> frozenset[int]:
        """Ids that frame messages (for callers that split chunks at markers)."""
        return frozenset((self.config.start_id, self.config.message_id, *self.config.stop_ids))

    def start(self, prompt_token_ids: Sequence[int] = ()) -> HarmonyState:
        """The output opens the header of an assistant message (the prompt ends with its role)."""
        return HarmonyState()

    def feed(
        self, state: FamilyState, token_ids: Sequence[int], text: str = ""
    ) -> tuple[HarmonyState, list[Event]]:
        """Parse one chunk of ids; `text` is not used (Harmony is read from the ids' bytes)."""
        assert isinstance(state, HarmonyState)
        events: list[Event] = []
        config = self.config
        table = config.token_bytes
        size = len(table)
        mode, first, raw = state.mode, state.first, state.raw
        header_at, kind, pending = state.header_at, state.kind, state.pending
        started = state.tools_started
        run: list[bytes] = []  # bytes of the message ids read since the last decode, one per id
        for token in token_ids:
            data = table[token] if 0 <= token < size else b""
            if mode == BODY:
                if token not in config.stop_ids:
                    run.append(data)
                    continue
                pending = self._text(kind, started, run, pending, events)
                run.clear()
                self._close(kind, started, pending, events)
                mode, pending = EXPECT_START, b""
            elif mode == RAW:
                run.append(data)
            elif mode == EXPECT_START:
                # Ids between messages other than <|start|> are dropped (StreamableParser raises).
                if token == config.start_id:
                    raw += data
                    mode, header_at = HEADER, len(raw)
            elif token != config.message_id:
                raw += data
            else:
                header = self._header(raw[header_at:], first)
                if header is None:
                    # The header is dropped, its text stays in `raw` (vLLM shows it at the end).
                    mode = EXPECT_START
                    continue
                first, raw, header_at = False, b"", 0
                mode, kind = BODY, message_kind(header)
                if kind == TOOL and self.tools:
                    recipient = _normalize_recipient(header.recipient) or ""
                    events.append(ToolCallStart(started, recipient.removeprefix("functions.")))
                    started += 1
            if len(raw) > MAX_HEADER_BYTES:
                # Not Harmony: everything since the last message is content, as is the rest.
                mode, run, raw, header_at, kind = RAW, [raw], b"", 0, CONTENT
        if run:
            pending = self._text(kind, started, run, pending, events)
        new = HarmonyState(mode, first, raw, header_at, kind, pending, started)
        return new, events

    def finish(self, state: FamilyState) -> tuple[HarmonyState, list[Event]]:
        """End of output: close the open message, or show an unclosed header as content."""
        assert isinstance(state, HarmonyState)
        events: list[Event] = []
        if state.mode in (BODY, RAW):
            self._close(state.kind, state.tools_started, state.pending, events)
        elif state.mode == HEADER and state.raw:
            events.append(ContentDelta(state.raw.decode(errors="replace")))
        return HarmonyState(EXPECT_START, state.first, tools_started=state.tools_started), events

    def _header(self, data: bytes, first: bool) -> HarmonyHeader | None:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return None
        return parse_header(text, "assistant" if first else None)

    def _text(
        self, kind: int, started: int, run: list[bytes], pending: bytes, events: list[Event]
    ) -> bytes:
        """Decode a run of message ids' bytes and report the text; returns the bytes still held.

        Valid UTF-8 decodes in one go; a bad sequence is read id by id as StreamableParser does,
        so each chunk's text is the same as vLLM's.
        """
        data = pending + b"".join(run)
        try:
            text, held = data.decode(), b""
        except UnicodeDecodeError as exc:
            if exc.reason != "unexpected end of data" or exc.end < len(data):
                return self._text_by_id(kind, started, run, pending, events)
            text, held = data[: exc.start].decode(), data[exc.start :]
        self._emit(kind, started, text, events)
        return held

    def _text_by_id(
        self, kind: int, started: int, run: list[bytes], pending: bytes, events: list[Event]
    ) -> bytes:
        parts: list[str] = []
        for data in run:
            text, pending = _take_text(pending + data)
            parts.append(text)
        self._emit(kind, started, "".join(parts), events)
        return pending

    def _emit(self, kind: int, started: int, text: str, events: list[Event]) -> None:
        if not text:
            return
        if kind == CONTENT:
            events.append(ContentDelta(text))
        elif kind == REASONING:
            if self.reasoning:
                events.append(ReasoningDelta(text))
        elif kind == TOOL and self.tools:
            events.append(ToolArgsDelta(started - 1, text))

    def _close(self, kind: int, started: int, pending: bytes, events: list[Event]) -> None:
        """A message ends: its unfinished character becomes U+FFFD, a tool call ends."""
        if pending:
            self._emit(kind, started, pending.decode(errors="replace"), events)
        if kind == TOOL and self.tools:
            events.append(ToolCallEnd(started - 1))


# ---- render: vLLM's structural tags for Harmony (xgrammar's JSON, byte for byte) -----------

_END_TAG: Final = ["<|end|>", ""]
_ANY_TEXT: Final[dict[str, Any]] = {
    "type": "any_text",
    "excludes": [],
    "max_tokens": None,
    "max_chars": None,
}
_CALL_CHANNELS: Final = ("<|channel|>commentary", "<|channel|>analysis", "<|channel|>final")
_JSON_CONSTRAINS: Final = (" json", " <|constrain|>json")
_CALL_BEGINS: Final = (
    " to=functions.{name}{channel}{constrain}<|message|>",
    "{channel} to=functions.{name}{constrain}<|message|>",
)
_STRUCTURED_KINDS: Final = ("json", "regex", "choice", "grammar", "json_object")


def _tag(begin: str, content: dict[str, Any], end: Any = _END_TAG) -> dict[str, Any]:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def _final_begin(constrain: str) -> str:
    return f"<|channel|>final{constrain}<|message|>"


def _preamble(channel: str) -> dict[str, Any]:
    """An optional whole message on `channel` before the constrained one."""
    message = _tag(f"<|channel|>{channel}<|message|>", dict(_ANY_TEXT), "<|end|>")
    start = {"type": "const_string", "value": "<|start|>assistant"}
    return {"type": "optional", "content": {"type": "sequence", "elements": [message, start]}}


def _assemble(commentary: bool, content: dict[str, Any]) -> dict[str, Any]:
    elements = [_preamble("analysis")]
    if commentary:
        elements.append(_preamble("commentary"))
    elements.append(content)
    return {"type": "structural_tag", "format": {"type": "sequence", "elements": elements}}


def _output_content(structured: dict[str, Any]) -> dict[str, Any] | None:
    """vLLM's structured_outputs_to_format: the format the final answer must follow."""
    if structured.get("json_object"):
        return _json_schema({"type": "object"})
    schema = structured.get("json")
    if schema is not None:
        return _json_schema(json.loads(schema) if isinstance(schema, str) else schema)
    if structured.get("regex") is not None:
        return {"type": "regex", "pattern": structured["regex"]}
    if structured.get("choice") is not None:
        choices = [{"type": "const_string", "value": c} for c in structured["choice"]]
        return {"type": "or", "elements": choices}
    if structured.get("grammar") is not None:
        return {"type": "grammar", "grammar": structured["grammar"]}
    tag = structured.get("structural_tag")
    if tag is not None:
        value = json.loads(tag) if isinstance(tag, str) else tag
        if isinstance(value, dict) and "structures" in value:
            legacy = [
                _tag(s.get("begin"), _json_schema(s.get("schema")), s.get("end"))
                for s in value["structures"]
            ]
            return {
                "type": "triggered_tags",
                "triggers": value.get("triggers"),
                "tags": legacy,
                "at_least_one": False,
                "stop_after_first": False,
                "excludes": [],
            }
        if isinstance(value, dict):
            fmt = value.get("format")
            return fmt if isinstance(fmt, dict) else None
    return None


def _json_schema(schema: Any) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": schema,
        "style": "json",
        "any_order": False,
        "max_whitespace_cnt": None,
        "excludes": [],
    }


def harmony_output_tag(structured: dict[str, Any] | None) -> dict[str, Any] | None:
    """Structured outputs as vLLM's Harmony parser rewrites them: the constraint moves into
    a structural tag on the final channel (after an optional analysis message).

    `structured` is vLLM's StructuredOutputsParams as a dict (None: no constraint).
    """
    if structured is None:
        return None
    content = _output_content(structured)
    if content is None:
        return structured
    if content["type"] == "json_schema":
        final: dict[str, Any] = {
            "type": "or",
            "elements": [_tag(_final_begin(c), content) for c in _JSON_CONSTRAINS],
        }
    else:
        final = _tag(_final_begin(""), content)
    out = dict(structured)
    out.update(dict.fromkeys(_STRUCTURED_KINDS))
    out["structural_tag"] = json.dumps(_assemble(False, final))
    return out


def harmony_tools_format(request: ParseRequest, strict_level: str, auto: bool) -> Any:
    """The tool-call alternatives (xgrammar `or` format) vLLM's "harmony" tag model builds,
    or None when the request's tools are not constrained (see `constrained_functions`)."""
    constrained = constrained_functions(request, strict_level)
    if constrained is None:
        return None
    functions, level = constrained
    tags = [
        _tag(
            pattern.format(name=function.get("name", ""), channel=channel, constrain=constrain),
            json_content(function, level),
        )
        for function in functions
        for pattern in _CALL_BEGINS
        for constrain in _JSON_CONSTRAINS
        for channel in _CALL_CHANNELS
    ]
    if auto:
        tags.extend(_tag(_final_begin(c), dict(_ANY_TEXT)) for c in (*_JSON_CONSTRAINS, ""))
    return _assemble(True, {"type": "or", "elements": tags})


def harmony_tools_tag(
    structured: dict[str, Any] | None, request: ParseRequest, strict_level: str
) -> str | None:
    """The structural tag that replaces the structured outputs when tool calls are
    constrained (vLLM's `_apply_structural_tag` with the "harmony" tag model), else None.

    `structured` is what `harmony_output_tag` returned. Asked only when tool calls are parsed
    (a tool parser with `--enable-auto-tool-choice`).
    """
    choice = request.effective_tool_choice
    if not request.tools or choice not in ("auto", "required", "named"):
        return None
    auto = choice == "auto"
    output = _output_content(structured) if auto and structured is not None else None
    if auto and structured is not None and request.parallel_tool_calls is False:
        # With structured outputs, auto keeps its format-only grammar: no stricter level.
        request = msgspec.structs.replace(request, parallel_tool_calls=True)
    tag = harmony_tools_format(request, strict_level, auto and output is None)
    if tag is None:
        return None
    if output is not None:
        tag = {
            "type": "structural_tag",
            "format": {"type": "or", "elements": [tag["format"], output]},
        }
    return json.dumps(tag)
