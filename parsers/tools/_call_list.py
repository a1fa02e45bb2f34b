"""A JSON list of call objects, `[{"name": …, "arguments": {…}}, …]`, read as it streams.

Shared by the families whose calls are such a list: Mistral before tokenizer v11 (after its
`[TOOL_CALLS]` token) and vLLM's generic forced tool choice (`tool_choice: "required"`
constrains the answer to `[{"name": …, "parameters": {…}}]`). A lone object is one call.

Each object is decided by its first key: `"name"`, `"arguments"` or `"parameters"` make it a
call, read by the Hermes lexer so the arguments go out exactly as written; anything else gives
the text back as content. Text after the list that is not whitespace is content, and so is
everything from the first character that does not fit the list: no character is lost.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from parsers.events import ContentDelta, Event, ToolCallEnd
from parsers.tools.hermes import HermesCall, scan_object

__all__ = ["CallList", "close", "open_list", "scan"]

_LEAD = 0  # before the list: whitespace, then "[" (or a lone "{")
_ITEM = 1  # after "[" or ",": an object starts
_OPEN = 2  # after "{": held up to the end of the first key
_OBJECT = 3  # inside a call object
_BETWEEN = 4  # after an object in the list: "," or "]"
_DONE = 5  # after the list (or the lone object): trailing whitespace
_CONTENT = 6  # the rest is content

_CALL_KEYS = ("name", "arguments", "parameters")
_List = TypeVar("_List", bound="CallList")
_WHITESPACE = " \t\r\n"
#: Undecided text held back (whitespace, brackets, the first key) before it counts as content.
_MAX_HELD = 256


class CallList(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """State of one list: where it stands around its objects, and the open object.

    A family may subclass it with its own tag (its `FamilyState`); `scan` keeps the subclass.
    """

    index: int  # index of the next call
    mode: int = _LEAD
    held: str = ""  # undecided text, given back as content if it is not a call
    in_list: bool = False  # a "[" opened the section (else a lone object)
    in_key: bool = False  # `held` ends inside the first key's string
    key: str = ""
    obj: HermesCall | None = None


def open_list(index: int, held: str) -> CallList:
    """State just after a list's `[` (and whitespace) that is already `held`."""
    return CallList(index=index, mode=_ITEM, held=held, in_list=True)


def scan(calls: _List, text: str) -> tuple[_List, list[Event]]:
    """Read more of the section; return the new state and its events."""
    obj = calls.obj
    if calls.mode == _OBJECT and obj is not None:
        # Inside an object (most chunks): the lexer reads the chunk; nothing else changes.
        scanned, read, used = scan_object(obj, text)
        if not scanned.closed and used == len(text):
            return msgspec.structs.replace(calls, obj=scanned), read
    mode, held, in_list = calls.mode, calls.held, calls.in_list
    in_key, key, obj, index = calls.in_key, calls.key, calls.obj, calls.index
    events: list[Event] = []
    i, n = 0, len(text)
    while i < n:
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
                obj, mode = None, (_BETWEEN if in_list else _DONE)
            continue
        c = text[i]
        if mode == _OPEN:
            mode, held, in_key, key, obj = _first_key(c, held, in_key, key, index)
            if mode != _CONTENT:
                i += 1
            continue
        if c in _WHITESPACE:
            held += c
            i += 1
            if len(held) > _MAX_HELD:
                mode = _CONTENT
            continue
        if mode == _LEAD and c == "[":
            mode, in_list = _ITEM, True
        elif c == "{" and (mode == _ITEM or (mode == _LEAD and not in_list)):
            mode, in_key, key = _OPEN, False, ""
        elif mode == _BETWEEN and c in ",]":
            mode = _ITEM if c == "," else _DONE
            held = c if c == "," else ""
            i += 1
            continue
        else:
            mode = _CONTENT
            continue
        held += c
        i += 1
    # `replace` keeps the caller's subclass (a family's tagged state).
    new_state = msgspec.structs.replace(
        calls, index=index, mode=mode, held=held, in_list=in_list, in_key=in_key, key=key, obj=obj
    )
    return new_state, events


def close(calls: _List) -> list[Event]:
    """End of output: end an open call, give back undecided text (not trailing whitespace)."""
    if calls.obj is not None:
        obj = calls.obj
        return [ToolCallEnd(obj.index, complete=obj.closed)] if obj.started else []
    if calls.mode in (_DONE, _BETWEEN) or not calls.held:
        return []
    return [ContentDelta(calls.held)]


def _first_key(
    c: str, held: str, in_key: bool, key: str, index: int
) -> tuple[int, str, bool, str, HermesCall | None]:
    """One character of an object's opening, up to its first key: (mode, held, in_key, key, obj)."""
    if not in_key:
        if c in _WHITESPACE and len(held) < _MAX_HELD:
            return _OPEN, held + c, False, key, None
        if c == '"':
            return _OPEN, held + c, True, "", None
        return _CONTENT, held, False, key, None
    if c == '"' and key in _CALL_KEYS:
        # The first key makes this a call: hand the object so far to the lexer.
        brace = held.rindex("{")
        obj, _, _ = scan_object(HermesCall(index=index), held[brace:] + c)
        return _OBJECT, "", False, "", obj
    if c != '"' and any(k.startswith(key + c) for k in _CALL_KEYS):
        return _OPEN, held + c, True, key + c, None
    return _CONTENT, held, False, key, None
