"""One streaming machine for tag-delimited formats: reasoning, content and key/value tool calls.

vLLM 0.33 parses GLM-4.5 and MiniMax-M2 output with its declarative parser engine: marker
tokens matched by id, other tags lexed from the text, a table from (state, tag) to the next
state, and a layer that shapes what each chunk streams. This module is that kind of machine
written as a value: a family module gives the tags, the table and an argument scanner
(`EngineSpec`); the state between chunks (`EngineState`) holds at most one partial tag, a few
held whitespace characters and the call being read.

What each chunk streams follows vLLM's shaping, made independent of the chunking:

* reasoning holds back its trailing whitespace until more reasoning follows; whitespace that
  ends the reasoning is dropped (vLLM strips it in batch and streaming alike);
* content that is only whitespace, before any other content, waits: it goes out with the next
  content, is dropped when a tool call starts, and at the end goes out only if no call started
  (vLLM decides per chunk, so its one-token stream drops a newline that bigger chunks keep:
  docs/compat.md);
* content that follows a tool event in the same chunk goes out with the next chunk that
  streams no call text, as vLLM does;
* a call streams its name once the name is complete and names a requested tool, then its
  arguments (`parsers._args_json`). A call of an unknown function is dropped, markup and all,
  when a marker token opened it (the call token, the call block); a call that typed text opened
  in the content (MiniMax's bare `<invoke name=`, also prose) falls back to content when its
  function is unknown or its name never ends: its markup and everything after it stay content,
  as written (vLLM's stream drops them; docs/compat.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import msgspec

from parsers._args_json import ArgsWriter, ToolSchemas, json_string, tool_schemas
from parsers._lexer import Lexicon
from parsers._segments import split_at_markers
from parsers.events import (
    ContentDelta,
    Event,
    ReasoningDelta,
    ToolArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from parsers.family import FamilyState

if TYPE_CHECKING:
    from parsers.facts import TokenizerFacts
    from parsers.request import ParseRequest

__all__ = [
    "EngineConfig",
    "EngineSpec",
    "EngineState",
    "ToolMode",
]

#: Held whitespace (reasoning's trailing, content's leading) and waiting content are bounded:
#: past this many characters they stream (vLLM holds them without limit).
MAX_HELD = 256

# Modes of the machine.
REASONING = 0
CONTENT = 1
PREAMBLE = 2  # inside a call block, before a call (MiniMax)
NAME = 3
ARGS = 4
BETWEEN = 5  # inside a call block, after a call (MiniMax)

# Tag kinds. Marker tokens are matched by id; their spellings typed as text are plain text.
K_TEXT = 0  # a spelling held back like a tag but read as text
K_THINK_START = 1
K_THINK_END = 2
K_TOOL_START = 3  # the call (GLM) or call block (MiniMax) token
K_TOOL_END = 4
K_DROP = 5  # another special token: vLLM's engine drops it
K_CALL_OPEN = 6  # MiniMax `<invoke name=`
K_NAME_END = 7  # MiniMax `">`, `'>`, `>`
K_CALL_END = 8  # MiniMax `</invoke>`
K_ARGS_OPEN = 9  # GLM `<arg_key>`: the name ends, the arguments begin
K_ARG_TAG = 10  # any other argument tag

# What a tag does in a mode (no entry: its spelling is text of the mode).
IGNORE = 0
END_REASONING = 1
START_REASONING = 2
OPEN_BLOCK = 3
OPEN_CALL = 4
NAME_DONE = 5
NAME_DONE_ARGS = 6  # the name is done and the tag is the first argument text
CLOSE_CALL = 7  # back to content
CLOSE_CALL_BETWEEN = 8
CLOSE_BLOCK = 9


class ToolMode:
    """How tool markup is treated for one request."""

    PARSE = 0  # calls are parsed and streamed
    SUPPRESS = 1  # markup is parsed and swallowed (tool_choice "none" with tools)
    HIDDEN = 2  # calls are parsed but not returned (no tools in the request)
    RAW = 3  # no tool parsing at all: markup is content


ARG_OPEN = 0
ARG_TEXT = 1
ARG_CLOSE = 2


class ArgScan(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Where a family's argument scanner stands: its mode, a held tail or key, the key."""

    mode: int = 0
    buf: str = ""
    key: str = ""


class ArgScanner(Protocol):
    """A family's reader of the argument text of one call."""

    def __call__(
        self, state: ArgScan, text: str, final: bool
    ) -> tuple[ArgScan, list[tuple[int, str]]]:
        """Read text; return the new state and operations (ARG_OPEN key, ARG_TEXT, ARG_CLOSE)."""
        ...


def marker_kinds(facts: TokenizerFacts, ids: dict[int, int]) -> dict[int, tuple[int, str]]:
    """Marker id -> (kind, spelling) for a family's `ids` (kind -> id); the tokenizer's other
    special tokens are `K_DROP`, as vLLM's engine drops them."""
    spellings = {token_id: spelling for spelling, token_id in facts.added_tokens.items()}
    markers = {token_id: (kind, spellings[token_id]) for kind, token_id in ids.items()}
    for token_id in facts.special_ids:
        if token_id not in markers and token_id in spellings:
            markers[token_id] = (K_DROP, spellings[token_id])
    return markers


class EngineSpec(msgspec.Struct, frozen=True, dict=True):
    """A family's grammar for one tokenizer: built once, shared by every request."""

    family: str
    lexicon: Lexicon
    #: Marker token id -> (kind, spelling).
    markers: dict[int, tuple[int, str]]
    #: (mode, kind) -> action.
    table: dict[tuple[int, int], int]
    args: ArgScanner
    #: Marker id -> spelling, for splitting chunks.
    spellings: dict[int, str]
    think_start_id: int | None
    think_end_id: int | None
    #: Ids that end reasoning in a prompt (`</think>`, a call start).
    end_ids: frozenset[int]
    #: Ids where the prompt look-back stops (GLM's turn tokens; none for MiniMax).
    boundary_ids: frozenset[int]
    #: Whitespace around a call's name is not part of it (GLM).
    strip_name: bool = False
    #: The argument scanner's mode inside a value (a plain-text chunk extends the value).
    args_value_mode: int = -1


class EngineConfig(msgspec.Struct, frozen=True, dict=True):
    """The spec bound to one request."""

    spec: EngineSpec
    reasoning: bool  # a reasoning parser of this family is configured (and thinking is on)
    tools: int  # ToolMode
    schemas: ToolSchemas
    include_reasoning: bool
    #: MiniMax append-think: the reasoning is content, after a "<think>" prefix.
    append_think: bool = False

    @property
    def spellings(self) -> dict[int, str]:
        """Marker id -> spelling, for splitting chunks."""
        return self.spec.spellings


class CallState(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """The call being read: its name, the argument scanner and the JSON written so far."""

    index: int  # the index the call gets if it is streamed
    name: str = ""
    started: bool = False  # ToolCallStart was emitted
    rejected: bool = False  # the name is not a requested tool: the call is swallowed
    #: The opening tag when typed text opened the call in the content (else ""), and the
    #: content whitespace held before it: given back as content if no call comes of it.
    opener: str = ""
    lead: str = ""
    hidden: bool = False  # parsed but not returned (no tools in the request)
    scan: ArgScan = ArgScan()
    writer: ArgsWriter = ArgsWriter()


class EngineState(FamilyState, frozen=True, gc=False, tag="tag_engine"):
    """Everything one stream needs between chunks; never the history."""

    mode: int = CONTENT
    hold: str = ""  # a tail that may still become a tag
    think_ws: str = ""  # trailing reasoning whitespace, held
    lead_ws: str = ""  # leading content whitespace, held
    content_started: bool = False
    after_tool: str = ""  # content after a tool event, waiting for a chunk without call text
    calls: int = 0  # calls opened (vLLM's tool slots), streamed or not
    streamed: int = 0  # calls streamed (the next call's index)
    call: CallState | None = None
    fresh: bool = True  # nothing was fed yet (append-think writes "<think>" first)
    #: Reasoning tags are tags (a reasoning parser is on and the template did not switch
    #: thinking off); decided at the start, as later chunks no longer carry template kwargs.
    thinking: bool = True

    @property
    def tools_emitted(self) -> bool:
        """Whether any tool call was streamed (finish_reason "tool_calls")."""
        return self.streamed > 0


def bind(spec: EngineSpec, request: ParseRequest, *, reasoning: bool, tools: bool,
         append_think: bool = False) -> EngineConfig:  # fmt: skip
    """The spec for one request: tool mode from the request, schemas of its tools.

    `reasoning`: a reasoning parser of the family is on and thinking is enabled; `tools`: its
    tool parser is on (`--enable-auto-tool-choice`).
    """
    if not tools:
        mode = ToolMode.RAW
    elif not request.tools:
        mode = ToolMode.RAW if append_think else ToolMode.HIDDEN
    elif request.effective_tool_choice == "none":
        mode = ToolMode.RAW if append_think else ToolMode.SUPPRESS
    else:
        mode = ToolMode.PARSE
    return EngineConfig(
        spec=spec,
        reasoning=reasoning and not append_think,
        tools=mode,
        schemas=tool_schemas(request.tools),
        include_reasoning=request.include_reasoning,
        append_think=append_think,
    )


def prompt_closes_reasoning(spec: EngineSpec, prompt_token_ids: Sequence[int]) -> bool:
    """vLLM's `is_reasoning_end(prompt)` for the family: did the prompt leave reasoning?"""
    for token_id in reversed(prompt_token_ids):
        if token_id in spec.end_ids:
            return True
        if token_id == spec.think_start_id or token_id in spec.boundary_ids:
            return False
    return False


def start(config: EngineConfig, prompt_token_ids: Sequence[int]) -> EngineState:
    """Initial state: in reasoning unless there is none or the prompt closed it."""
    if config.append_think:
        if _last_think_marker_closes(config.spec, prompt_token_ids):
            return EngineState(mode=CONTENT, fresh=False, thinking=False)
        return EngineState(mode=REASONING, content_started=True, thinking=False)
    if config.reasoning and not prompt_closes_reasoning(config.spec, prompt_token_ids):
        return EngineState(mode=REASONING)
    return EngineState(mode=CONTENT, thinking=config.reasoning)


def _last_think_marker_closes(spec: EngineSpec, prompt_token_ids: Sequence[int]) -> bool:
    """Append-think's own check: the last `<think>`/`</think>` of the prompt is `</think>`."""
    for token_id in reversed(prompt_token_ids):
        if token_id == spec.think_end_id:
            return True
        if token_id == spec.think_start_id:
            return False
    return False


class _Run:
    """One feed or finish: the state as locals plus what the chunk streams."""

    def __init__(self, config: EngineConfig, state: EngineState) -> None:
        self.config = config
        self.spec = config.spec
        self.s = state
        self.reasoning: list[str] = []
        self.reasoning_out: list[str] = []
        self.content: list[str] = []
        self.after: list[str] = []
        self.tool_events: list[Event] = []
        self.tool_seen = False  # a call was read in this chunk: content after it waits
        self.tool_delta = False  # call text (name or arguments) streamed in this chunk

    def replace(self, **changes: object) -> None:
        self.s = msgspec.structs.replace(self.s, **changes)

    # ---- text of each mode ----------------------------------------------------------------

    def text(self, text: str) -> None:
        if not text:
            return
        mode = self.s.mode
        if mode == REASONING:
            if self.config.append_think:
                self.emit_content(text)
            else:
                self.reasoning.append(text)
        elif mode == CONTENT:
            self.emit_content(text)
        elif mode == NAME:
            call = self.s.call
            if call is not None:
                self.seen(call)
                name = call.name + text
                if len(name) > MAX_HELD and call.opener:  # longer than any tool name
                    self.fall_back(text)
                    return
                if len(name) > MAX_HELD:  # the call is dropped
                    call = msgspec.structs.replace(call, rejected=True, name="")
                elif not call.rejected:
                    call = msgspec.structs.replace(call, name=name)
                self.replace(call=call)
        elif mode == ARGS:
            self.args_text(text, final=False)
        # PREAMBLE and BETWEEN: text between calls is not content.

    def seen(self, call: CallState) -> None:
        if self.config.tools != ToolMode.SUPPRESS:
            self.tool_seen = True

    def emit_content(self, text: str) -> None:
        s = self.s
        if not text:
            if s.content_started:
                self.content.append("")  # an empty delta still streams (append-think)
            return
        if not s.content_started and self.config.tools != ToolMode.RAW:
            held = s.lead_ws + text
            if not held.strip() and len(held) <= MAX_HELD:
                self.replace(lead_ws=held)
                return
            text = held
            self.replace(lead_ws="", content_started=True)
        # Text waits behind earlier waiting text, so the content keeps the model's order
        # (vLLM can stream newer text before older waiting text: docs/compat.md).
        waits = self.tool_seen or bool(s.after_tool)
        (self.after if waits else self.content).append(text)

    # ---- tags -----------------------------------------------------------------------------

    def tag(self, kind: int, spelling: str, by_id: bool) -> None:
        if kind == K_TEXT or (not by_id and kind <= K_DROP):
            self.text(spelling)  # a marker token's spelling typed as text
            return
        if not self.s.thinking and kind in (K_THINK_START, K_THINK_END):
            self.text(spelling)
            return
        mode = self.s.mode
        action = self.spec.table.get((mode, kind))
        if action is None:
            if kind != K_DROP:
                self.text(spelling)
            return
        if action == IGNORE:
            return
        if action == END_REASONING:
            self.end_reasoning()
        elif action == START_REASONING:
            self.flush_reasoning(ending=False)
            self.replace(mode=REASONING)
        elif action in (OPEN_BLOCK, OPEN_CALL):
            if mode == REASONING:
                self.end_reasoning()
            if self.config.tools == ToolMode.RAW:
                self.text(spelling)
            elif action == OPEN_BLOCK:
                self.replace(mode=PREAMBLE)
            else:
                self.open_call(spelling if not by_id and mode == CONTENT else "")
        elif action == NAME_DONE:
            self.name_done(spelling)
            if self.s.call is not None:
                self.replace(mode=ARGS)
        elif action == NAME_DONE_ARGS:
            self.name_done()
            self.replace(mode=ARGS)
            self.args_text(spelling, final=False)
        elif action in (CLOSE_CALL, CLOSE_CALL_BETWEEN):
            self.close_call()
            self.replace(mode=CONTENT if action == CLOSE_CALL else BETWEEN)
        elif action == CLOSE_BLOCK:
            self.replace(mode=CONTENT)

    # ---- reasoning ------------------------------------------------------------------------

    def flush_reasoning(self, ending: bool) -> None:
        """Stream this chunk's reasoning, holding (at its end: dropping) trailing whitespace."""
        joined = self.s.think_ws + "".join(self.reasoning)
        self.reasoning = []
        kept = joined.rstrip()
        if not ending and len(joined) - len(kept) > MAX_HELD:
            kept = joined
        if kept:
            self.reasoning_out.append(kept)
        self.replace(think_ws="" if ending else joined[len(kept) :])

    def end_reasoning(self) -> None:
        self.flush_reasoning(ending=True)
        self.replace(mode=CONTENT)

    # ---- calls ----------------------------------------------------------------------------

    def open_call(self, opener: str = "") -> None:
        """Open a call; `opener` is the tag when typed text opened it in the content."""
        s = self.s
        if self.config.tools == ToolMode.SUPPRESS:
            self.replace(mode=NAME, call=CallState(index=s.streamed, rejected=True))
            return
        self.tool_seen = True
        hidden = self.config.tools == ToolMode.HIDDEN
        call = CallState(index=s.streamed, hidden=hidden, opener=opener, lead=s.lead_ws)
        self.replace(mode=NAME, call=call, calls=s.calls + 1, lead_ws="")

    def name_done(self, end: str = "") -> None:
        """The name is complete (`end`: the tag that ended it): stream the call's start if it
        names a requested tool; otherwise drop the call, or give a typed one back as content."""
        call = self.s.call
        if call is None or call.started or call.rejected:
            return
        name = call.name.strip() if self.spec.strip_name else call.name
        schemas = self.config.schemas
        if not name or (schemas and name not in schemas):
            if call.opener:
                self.fall_back(end)
            else:
                self.replace(call=msgspec.structs.replace(call, rejected=True))
            return
        self.tool_delta = True
        if not call.hidden:
            self.tool_events.append(ToolCallStart(call.index, name))
        self.replace(
            call=msgspec.structs.replace(call, name=name, started=True),
            streamed=self.s.streamed + (0 if call.hidden else 1),
        )

    def fall_back(self, tail: str) -> None:
        """No call comes of a typed opening tag: the tag, the name read so far and `tail` are
        content, and so is what follows."""
        call = self.s.call
        assert call is not None
        self.replace(call=None, mode=CONTENT, calls=self.s.calls - 1, lead_ws=call.lead)
        self.emit_content(call.opener + call.name + tail)

    def args_text(self, text: str, final: bool) -> None:
        call = self.s.call
        if call is None:
            return
        self.seen(call)
        if not call.started:
            self.name_done()
            call = self.s.call
            if call is None or not call.started:
                return
        scan, ops = self.spec.args(call.scan, text, final)
        writer = call.writer
        schema = self.config.schemas.get(call.name)
        pieces: list[str] = []
        for op, value in ops:
            if op == ARG_OPEN:
                writer, out = writer.open_value(value, schema)
            elif op == ARG_TEXT:
                writer, out = writer.value_text(value)
            else:
                writer, out = writer.close_value(), ""
            if out:
                pieces.append(out)
        if pieces:
            self.tool_delta = True
            if not call.hidden:
                self.tool_events.append(ToolArgsDelta(call.index, "".join(pieces)))
        self.replace(call=msgspec.structs.replace(call, scan=scan, writer=writer))

    def close_call(self) -> None:
        call = self.s.call
        if call is None:
            return
        self.seen(call)
        if call.started:
            self.args_text("", final=True)
        else:
            self.name_done()
        call = self.s.call
        if call is not None and call.started:
            tail = call.writer.end()
            if tail:
                self.tool_delta = True
            if not call.hidden:
                if tail:
                    self.tool_events.append(ToolArgsDelta(call.index, tail))
                self.tool_events.append(ToolCallEnd(call.index, complete=not call.writer.open))
        self.replace(call=None)

    # ---- output -------------------------------------------------------------------------

    def events(self, finished: bool) -> tuple[EngineState, list[Event]]:
        if self.reasoning or self.s.think_ws:
            self.flush_reasoning(ending=finished or self.s.mode != REASONING)
        s = self.s
        waiting = s.after_tool + "".join(self.after)
        if finished or not self.tool_seen or not self.tool_delta or len(waiting) > MAX_HELD:
            parts = [s.after_tool, *self.content, *self.after]
            after = ""
        else:
            parts = self.content
            after = waiting
        if finished and s.lead_ws and not s.calls:
            parts.append(s.lead_ws)
        text = "".join(parts)
        out: list[Event] = []
        if self.reasoning_out and self.config.include_reasoning:
            out.append(ReasoningDelta("".join(self.reasoning_out)))
        if text or "" in self.content:
            out.append(ContentDelta(text))
        out.extend(self.tool_events)
        lead_ws = "" if finished else s.lead_ws
        return msgspec.structs.replace(s, after_tool=after, lead_ws=lead_ws, fresh=False), out


def feed(config: EngineConfig, state: EngineState, token_ids: Sequence[int], text: str
         ) -> tuple[EngineState, list[Event]]:  # fmt: skip
    """Parse one chunk: `text` is the decode of exactly `token_ids`, special tokens kept."""
    if text and not state.hold and not state.fresh:
        quick = _plain_text(config, state, token_ids, text)
        if quick is not None:
            return quick
    run = _Run(config, state)
    if config.append_think and state.mode == REASONING:
        # vLLM's append-think streams each chunk of the think block as it comes, after
        # "<think>" on the first, and "" for a chunk without text.
        run.emit_content("<think>" if state.fresh else "")
    lexicon = config.spec.lexicon
    markers = config.spec.markers
    for marker, piece in split_at_markers(token_ids, text, config.spellings):
        if _passthrough(config, run.s):
            if marker is not None and markers[marker][0] == K_THINK_END and run.s.mode == REASONING:
                run.text(piece)
                run.replace(mode=CONTENT)  # append-think: the think block ends, in the content
            else:
                run.text(piece)
        elif marker is None:
            pieces, hold = lexicon.lex(run.s.hold, piece)
            run.replace(hold=hold)
            for kind, part in pieces:
                if kind is None:
                    run.text(part)
                else:
                    run.tag(kind, part, by_id=False)
        else:
            _flush_hold(run)
            kind, spelling = markers[marker]
            run.tag(kind, spelling, by_id=True)
    return run.events(finished=False)


_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\]')


def _plain_text(
    config: EngineConfig, state: EngineState, token_ids: Sequence[int], text: str
) -> tuple[EngineState, list[Event]] | None:
    """The common chunk, text without markers or tag characters in a steady phase, without
    the general machinery (same result); None when the chunk needs the general path."""
    markers = config.spec.markers
    for token_id in token_ids:
        if token_id in markers:
            return None
    mode = state.mode
    passthrough = mode == REASONING if config.append_think else (
        mode == CONTENT and config.tools == ToolMode.RAW
    )  # fmt: skip
    if passthrough:
        return state, [ContentDelta(text)]
    if config.spec.lexicon.may_hold(text):
        return None
    if mode == REASONING:
        joined = state.think_ws + text
        kept = joined.rstrip()
        held = joined[len(kept) :]
        if len(held) > MAX_HELD:
            return None
        events: list[Event] = [ReasoningDelta(kept)] if kept and config.include_reasoning else []
        if held == state.think_ws:
            return state, events
        return msgspec.structs.replace(state, think_ws=held), events
    if mode == CONTENT and state.content_started and not state.after_tool:
        return state, [ContentDelta(text)]
    call = state.call
    if (
        mode == ARGS
        and call is not None
        and call.started
        and not call.hidden
        and call.writer.stream
        and call.scan.mode == config.spec.args_value_mode
        and not call.scan.buf
    ):
        escaped = json_string(text)[1:-1] if _NEEDS_ESCAPE.search(text) else text
        return state, [ToolArgsDelta(call.index, escaped)]
    return None


def _passthrough(config: EngineConfig, state: EngineState) -> bool:
    """Text that vLLM hands through unparsed: append-think's think block, and the content
    when no tool parser reads it."""
    if state.mode == REASONING:
        return config.append_think
    return state.mode == CONTENT and config.tools == ToolMode.RAW


def finish(config: EngineConfig, state: EngineState) -> tuple[EngineState, list[Event]]:
    """End of output: flush the held tail, end an open call, report held content."""
    run = _Run(config, state)
    _flush_hold(run)
    if run.s.mode in (NAME, ARGS, PREAMBLE, BETWEEN):
        run.close_call()
        run.replace(mode=CONTENT)
    return run.events(finished=True)


def _flush_hold(run: _Run) -> None:
    hold = run.s.hold
    if not hold:
        return
    run.replace(hold="")
    pieces, _ = run.spec.lexicon.lex("", hold, final=True)
    for kind, part in pieces:
        if kind is None:
            run.text(part)
        else:
            run.tag(kind, part, by_id=False)
