"""Llama 3.x JSON tool calls: `{"name": …, "parameters": {…}}` (vLLM `llama3_json`, `llama4_json`).

Format (Llama 3.1 model card, "JSON based tool calling",
https://www.llama.com/docs/model-cards-and-prompt-formats/llama3_1/; chat template in
https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/tokenizer_config.json): the
answer *is* the call, one JSON object with `"name"` and `"parameters"` (or `"arguments"`),
optionally after the `<|python_tag|>` token; several calls are separated by `; `. No token
closes a call: it ends with its object.

Whether the answer is a call is decided at its start, holding back only leading whitespace,
`<|python_tag|>`, and `{` up to its first key: the object is a call when that key is
`"name"`, `"parameters"` or `"arguments"`; anything else (prose, JSON that is not a call) is
content to the end. Call objects are scanned by the Hermes lexer (`scan_object`), so the
arguments are forwarded exactly as written. After a call, whatever is not `; ` and another
call is dropped, as vLLM does in both modes.
"""

from __future__ import annotations

from parsers.events import ContentDelta, Event, ToolCallEnd
from parsers.facts import TokenizerFacts
from parsers.family import FamilyState, Marker, ToolFamily
from parsers.request import ParseRequest
from parsers.structural_tag import TagSpelling, json_call_format
from parsers.tools.hermes import HermesCall, scan_object

__all__ = ["LlamaCall", "LlamaConfig", "build"]

# xgrammar's builtin "llama" template: one spelling, `parameters`, triggered by `{"name": `.
_TAG = TagSpelling(begin='{"name": "{name}", "parameters": ', end="}")
_TRIGGER = '{"name": '
_EXCLUDES = ("<think>", "</think>")

_LEAD = 0  # start of the answer, or after <|python_tag|>: whitespace is held
_OPEN = 1  # after "{": held up to the first key
_OBJECT = 2  # inside a call object
_BETWEEN = 3  # after a call: "; " and whitespace separate calls
_CONTENT = 4  # not a call: everything to the end is content
_DROP = 5  # not a call, after a call: everything to the end is dropped

_CALL_KEYS = ("name", "parameters", "arguments")
_WHITESPACE = " \t\r\n"
#: Leading whitespace held before the answer shows what it is; past this it is content.
_MAX_HELD = 128


class LlamaCall(FamilyState, frozen=True, tag="llama3_json", gc=False):
    """State of the answer section: undecided prefix, a call object, separators or content."""

    index: int  # index of the next call
    mode: int = _LEAD
    held: str = ""  # undecided text: whitespace, "<|python_tag|>", "{" and the first key
    in_key: bool = False  # `held` ends inside the first key's string
    key: str = ""
    obj: HermesCall | None = None
    after_call: bool = False  # an object was read: what is not a call is now dropped


class LlamaConfig(ToolFamily, frozen=True):
    """`<|python_tag|>` for one tokenizer; the answer itself opens the call section.

    vLLM's Llama3JsonToolParser leaves skip_special_tokens alone (the default).
    """

    start_id: int
    start_text: str
    family: str = "llama3_json"

    def markers(self) -> tuple[Marker, ...]:
        """`<|python_tag|>` only: no token closes a call."""
        return (Marker(self.start_id, self.start_text, "start"),)

    def structural_tag(self, request: ParseRequest, strict_level: str) -> str | None:
        """vLLM's tag from xgrammar's `llama` template for this request, or None."""
        return json_call_format(_TAG, _TRIGGER, list(_EXCLUDES), request, strict_level)

    def begin(self, index: int) -> LlamaCall:
        """`<|python_tag|>` was seen: a call may follow; if not, the tag is content (before
        any call) or dropped (after calls, like any text there)."""
        return LlamaCall(index=index, held=self.start_text, after_call=index > 0)

    def begin_answer(self, index: int) -> LlamaCall:
        """The answer starts: it may be calls (no token announces them)."""
        return LlamaCall(index=index)

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        """Scan more of the answer."""
        if not isinstance(call, LlamaCall):
            return call, []
        return _scan(call, text)

    def close(self, call: FamilyState) -> list[Event]:
        """End of output (or a new `<|python_tag|>`): end an open call, release held text."""
        if not isinstance(call, LlamaCall):
            return []
        if call.obj is not None:
            if not call.obj.started:
                return []
            return [ToolCallEnd(call.obj.index, complete=call.obj.closed)]
        return [ContentDelta(call.held)] if call.held and not call.after_call else []


def build(facts: TokenizerFacts) -> LlamaConfig:
    """Llama 3 JSON configuration for this tokenizer (vLLM requires `<|python_tag|>`)."""
    return LlamaConfig(
        start_id=facts.marker_id("<|python_tag|>", "llama3_json"),
        start_text="<|python_tag|>",
    )


def _scan(call: LlamaCall, text: str) -> tuple[LlamaCall, list[Event]]:
    mode, held, in_key, key, obj, index = (
        call.mode,
        call.held,
        call.in_key,
        call.key,
        call.obj,
        call.index,
    )
    after_call = call.after_call
    events: list[Event] = []
    i, n = 0, len(text)
    while i < n:
        if mode == _CONTENT and after_call:
            mode, held = _DROP, ""
        if mode == _DROP:
            break
        if mode == _CONTENT:
            events.append(ContentDelta(held + text[i:]))
            held = ""
            break
        if mode == _OBJECT and obj is not None:
            obj, obj_events, used = scan_object(obj, text[i:] if i else text)
            events.extend(obj_events)
            i += used
            if obj.closed:
                if obj.started:
                    events.append(ToolCallEnd(obj.index))
                    index = obj.index + 1
                obj, mode, after_call = None, _BETWEEN, True
            continue
        c = text[i]
        if mode in (_LEAD, _BETWEEN):
            if c in _WHITESPACE or (c == ";" and mode == _BETWEEN):
                if mode == _LEAD:
                    held += c
                    if len(held) > _MAX_HELD:
                        mode = _CONTENT
                i += 1
            elif c == "{":
                held += c
                mode, in_key, key = _OPEN, False, ""
                i += 1
            else:
                mode = _CONTENT
        elif not in_key:
            if c in _WHITESPACE and len(held) < _MAX_HELD:
                held += c
                i += 1
            elif c == '"':
                held += c
                in_key = True
                i += 1
            else:
                mode = _CONTENT
        elif c == '"' and key in _CALL_KEYS:
            # The first key makes this a call: hand the object so far to the lexer.
            obj, _, _ = scan_object(HermesCall(index=index), held + c)
            mode, held, in_key, key = _OBJECT, "", False, ""
            i += 1
        elif c != '"' and any(k.startswith(key + c) for k in _CALL_KEYS):
            held += c
            key += c
            i += 1
        else:
            mode = _CONTENT
    new_call = LlamaCall(
        index=index, mode=mode, held=held, in_key=in_key, key=key, obj=obj, after_call=after_call
    )
    return new_call, events
