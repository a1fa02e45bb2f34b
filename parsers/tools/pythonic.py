"""Pythonic tool calls: `[get_weather(city='Paris'), …]` (vLLM name `pythonic`).

Format (Llama 3.2 / Llama 4 "pythonic" function calling, https://www.llama.com/docs/model-cards-and-prompt-formats/llama3_2/;
used with Gemma 3's official template by vLLM deployments): the whole answer is one Python
list of calls with keyword arguments whose values are Python literals. Arguments are
converted to JSON as vLLM does (`json.dumps` of the literal: `'x'` -> `"x"`, `True` -> `true`,
`None` -> `null`, tuples and sets -> arrays, dict keys -> strings), streamed as they are read:
a key goes out with the first piece of its value, strings character by character, numbers and
names when they end.

Whether the answer is a call list is decided at its start: it must begin with `[` and the
first call is confirmed by its first `name=` (or by `)` when it has no arguments). Until then
the text is held, and given back as content if the list turns out not to be calls. Text that
cannot be read (a positional argument, an expression, a second list) ends the calls: the
current call keeps the arguments read before it and everything from there on is content, so
no character the model wrote is lost. Whitespace after the closing `]` is dropped; other
text after it is content.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec

from parsers.events import ContentDelta, Event, ToolArgsDelta, ToolCallEnd, ToolCallStart
from parsers.facts import TokenizerFacts
from parsers.family import FamilyState, Marker, ReasoningFamily, ToolFamily
from parsers.request import ParseRequest
from parsers.structural_tag import RenderAdjustments
from parsers.tools import _call_list

__all__ = ["PythonicCall", "PythonicTools", "build", "close", "forced_tool_schema", "scan"]

# Modes.
_LEAD = 0  # start of the answer: only "[" opens a call list
_ITEM = 1  # after "[" or "," between calls
_NAME = 2  # reading the function name (dotted names allowed)
_NAME_WS = 3  # whitespace after the name, before "("
_ARGS = 4  # after "(" or ",": a keyword, or ")"
_KW = 5  # reading a keyword
_KW_WS = 6  # whitespace after a keyword, before "="
_VALUE = 7  # a value (or a dict key) starts
_STR = 8  # inside a string literal
_STR_END = 9  # after a string literal: another literal may continue it
_NUM = 10  # reading a number
_WORD = 11  # reading a name: True/False/None/null/true/false, or a string prefix
_AFTER = 12  # after a value
_AFTER_CALL = 13  # after ")"
_DONE = 14  # after "]": trailing whitespace
_CONTENT = 15  # not (or no longer) calls: the rest is content
_NAMED = 16  # a named tool choice: the whole answer is that call's arguments
_JSON = 17  # tool_choice "required" and the answer is vLLM's JSON call list

_WS = " \t\r\n"
_IDENT = re.compile(r"[A-Za-z0-9_]*")
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.]*")
_WORD_CHARS = re.compile(r"[A-Za-z0-9_]*")
_JSON_ESCAPES = re.compile(r'["\\\x00-\x1f\ud800-\udfff]')
_NAMES = {
    "True": "true",
    "False": "false",
    "None": "null",
    "true": "true",
    "false": "false",
    "null": "null",
}
_PREFIXES = frozenset({"r", "u", "f", "rf", "fr", "b", "rb", "br"})
_SIMPLE_ESCAPES = {
    "\\": "\\",
    "'": "'",
    '"': '"',
    "a": "\x07",
    "b": "\x08",
    "f": "\x0c",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\x0b",
}
_HEX = frozenset("0123456789abcdefABCDEF")
_OCT = frozenset("01234567")
_CLOSERS = {"l": "]", "t": ")", "s": "}", "d": "}", "q": "}"}

#: Longest name, keyword, dict key, number or escape held back before it is given up on.
_MAX_HELD = 256
#: Deepest nesting of containers inside one argument.
_MAX_DEPTH = 32


class PythonicCall(FamilyState, frozen=True, tag="pythonic", gc=False):
    """Where the answer's call list stands; bounded by `_MAX_HELD` and `_MAX_DEPTH`.

    `raw` is the model's text since the last thing emitted (given back as content if what
    follows is not a call); `pending` is JSON to emit before the next value piece (a
    separator and a key). `frames` are the open containers of the current argument, one
    letter each: `l` list, `t` tuple, `s` set, `d` dict, `q` a brace whose kind is not known
    yet; upper case once the container has an element. `lookahead` is text that needs the
    next chunk to be read (a quote that may open or close a triple quote, an escape, an
    f-string brace).
    """

    index: int
    mode: int = _LEAD
    raw: str = ""
    lookahead: str = ""
    name: str = ""
    confirmed: bool = False  # ToolCallStart of the current call was emitted
    has_args: bool = False  # the current call has an argument
    pending: str = ""
    frames: str = ""
    key_mode: bool = False  # the value being read is a dict key (its JSON held in `key`)
    key: str = ""
    quote: str = ""  # the open literal's quote: ', ", ''' or \"\"\"
    raw_string: bool = False
    f_string: bool = False
    word: str = ""  # a keyword, number, name or string prefix being read
    negative: bool = False  # an odd number of "-" before a number
    signed: bool = False  # a unary sign was read: only a number may follow
    plain: bool = False  # the answer does not start with "[": it is content, chunk by chunk
    required: bool = False  # tool_choice "required": a JSON call list is read too
    json: _call_list.CallList | None = None  # that JSON list, once it began


def scan(call: PythonicCall, text: str) -> tuple[PythonicCall, list[Event]]:
    """Read more of the answer; return the new state and its events."""
    if (
        call.mode == _STR
        and not call.key_mode
        and not call.lookahead
        and not call.pending
        and not call.raw
        and text
        and _PLAIN[call.f_string].search(text) is None
    ):
        # The common case inside a long string value: the text is argument text as it is.
        return call, [ToolArgsDelta(call.index, text)]
    if not text:
        return call, []
    if call.mode == _NAMED:
        return _named(call, text)
    if call.mode == _JSON and call.json is not None:
        json_list, events = _call_list.scan(call.json, text)
        return msgspec.structs.replace(call, json=json_list), events
    scanner = _Scanner(call)
    scanner.run(call.lookahead + text, final=False)
    if scanner.mode == _DONE and not scanner.events:
        scanner.events.append(ContentDelta(""))
    return scanner.state(), scanner.events


def close(call: PythonicCall) -> list[Event]:
    """End of output: end an open call and give back held text that was not a call."""
    if call.mode == _NAMED:
        return [ToolCallEnd(call.index)] if call.confirmed else []
    if call.mode == _JSON and call.json is not None:
        return _call_list.close(call.json)
    scanner = _Scanner(call)
    scanner.run(call.lookahead, final=True)
    scanner.finish()
    return scanner.events


class _Scanner:
    """One `scan` call's working copy of the state (it never outlives the call)."""

    __slots__ = (
        "args",
        "confirmed",
        "events",
        "f_string",
        "final",
        "frames",
        "has_args",
        "index",
        "json",
        "key",
        "key_mode",
        "lookahead",
        "mode",
        "name",
        "negative",
        "pending",
        "plain",
        "quote",
        "raw",
        "raw_string",
        "required",
        "signed",
        "word",
    )

    def __init__(self, call: PythonicCall) -> None:
        (
            self.index,
            self.mode,
            self.raw,
            _,
            self.name,
            self.confirmed,
            self.has_args,
            self.pending,
            self.frames,
            self.key_mode,
            self.key,
            self.quote,
            self.raw_string,
            self.f_string,
            self.word,
            self.negative,
            self.signed,
            self.plain,
            self.required,
            self.json,
        ) = msgspec.structs.astuple(call)
        self.lookahead = ""
        self.final = False
        self.events: list[Event] = []
        self.args: list[str] = []

    def run(self, text: str, *, final: bool) -> None:
        self.final = final
        i, n = 0, len(text)
        while i < n:
            mode = self.mode
            if mode == _CONTENT:
                self.content(self.raw + text[i:])
                self.raw = ""
                break
            if mode == _JSON and self.json is not None:
                self.flush_args()
                self.json, more = _call_list.scan(self.json, text[i:])
                self.events.extend(more)
                break
            i = _DISPATCH[mode](self, text, i)
        self.flush_args()

    def need_more(self, text: str, i: int) -> int:
        """Keep `text[i:]` to be read again with the next chunk."""
        self.lookahead = text[i:]
        if len(self.lookahead) > _MAX_HELD:
            self.fail()
            return i
        return len(text)

    def state(self) -> PythonicCall:
        # Fields spelled out, here and in __init__: a loop over them costs ~3 µs per chunk.
        return PythonicCall(
            self.index,
            self.mode,
            self.raw,
            self.lookahead,
            self.name,
            self.confirmed,
            self.has_args,
            self.pending,
            self.frames,
            self.key_mode,
            self.key,
            self.quote,
            self.raw_string,
            self.f_string,
            self.word,
            self.negative,
            self.signed,
            self.plain,
            self.required,
            self.json,
        )

    # -- output ------------------------------------------------------------------------

    def content(self, text: str) -> None:
        if text:
            self.flush_args()
            self.events.append(ContentDelta(text))

    def emit(self, piece: str) -> None:
        """Argument JSON: the call starts, and the pending separator and key go out, with the
        first piece of a value (so a call whose first value cannot be read stays text)."""
        if not self.confirmed:
            self.confirm()
        if self.pending:
            self.args.append(self.pending)
            self.pending = ""
        self.args.append(piece)
        self.raw = ""

    def value_text(self, piece: str) -> None:
        """JSON of (part of) a value: into the held key, or out as arguments."""
        if not self.key_mode:
            self.emit(piece)
            return
        self.key += piece
        if len(self.key) > _MAX_HELD:
            self.fail()

    def flush_args(self) -> None:
        if self.args:
            self.events.append(ToolArgsDelta(self.index, "".join(self.args)))
            self.args = []

    def hold(self, text: str) -> None:
        """Text read but not yet emitted; bounded until the call is confirmed."""
        self.raw += text
        if len(self.raw) > _MAX_HELD and not self.confirmed:
            self.fail()

    def fail(self) -> None:
        """What follows is not a call: end the current call; the rest is content."""
        self.end_open_call()
        self.mode = _CONTENT
        self.pending = self.key = self.word = self.frames = self.lookahead = ""

    def end_open_call(self) -> None:
        """The output ended, or stopped being calls, inside a call: it never closed."""
        if self.confirmed:
            self.flush_args()
            self.events.append(ToolCallEnd(self.index, complete=False))
            self.index += 1
            self.confirmed = False

    def confirm(self) -> None:
        """The held `[name(` is a call: start it."""
        self.confirmed = True
        self.events.append(ToolCallStart(self.index, self.name))
        self.args.append("{")

    # -- the list and its calls ----------------------------------------------------------

    def lead(self, text: str, i: int) -> int:
        if text[i] != "[":
            self.mode = _CONTENT
            self.plain = True
            return i
        self.hold("[")
        self.mode = _ITEM
        return i + 1

    def item(self, text: str, i: int) -> int:
        c = text[i]
        if c in _WS:
            self.hold(c)
            return i + 1
        if c.isalpha() or c == "_":
            self.name = ""
            self.mode = _NAME
            return i
        if c == "]" and not self.raw.startswith("["):
            return self.close_list(i)  # a trailing comma: "[f(a=1),]"
        if c == "{" and self.required and self.raw.startswith("["):
            self.mode = _JSON  # vLLM's forced "required" format: [{"name": …, "parameters": …}]
            self.json = _call_list.open_list(self.index, self.raw)
            self.raw = ""
            return i
        self.mode = _CONTENT
        return i

    def read_name(self, text: str, i: int) -> int:
        end = _NAME_CHARS.match(text, i).end()  # type: ignore[union-attr]
        self.name += text[i:end]
        self.hold(text[i:end])
        if len(self.name) > _MAX_HELD:
            self.fail()
        elif end < len(text):
            self.mode = _NAME_WS
        return end

    def name_ws(self, text: str, i: int) -> int:
        c = text[i]
        if c in _WS:
            self.hold(c)
            return i + 1
        if c == "(" and all(part.isidentifier() for part in self.name.split(".")):
            self.hold(c)
            self.has_args = False
            self.mode = _ARGS
            return i + 1
        self.fail()
        return i

    def args_start(self, text: str, i: int) -> int:
        c = text[i]
        if c in _WS:
            self.hold(c)
            return i + 1
        if c == ")":
            return self.end_call(i)
        if c.isalpha() or c == "_":
            self.word = ""
            self.mode = _KW
            return i
        self.fail()
        return i

    def keyword(self, text: str, i: int) -> int:
        end = _IDENT.match(text, i).end()  # type: ignore[union-attr]
        self.word += text[i:end]
        self.hold(text[i:end])
        if len(self.word) > _MAX_HELD:
            self.fail()
        elif end < len(text):
            self.mode = _KW_WS
        return end

    def keyword_ws(self, text: str, i: int) -> int:
        c = text[i]
        if c in _WS:
            self.hold(c)
            return i + 1
        if c != "=" or not self.word.isidentifier():
            self.fail()
            return i
        self.hold(c)
        separator = ", " if self.has_args else ""
        # An identifier needs no JSON escaping.
        self.pending = separator + '"' + self.word + '": '

        self.has_args = True
        self.word = ""
        self.mode = _VALUE
        return i + 1

    def end_call(self, i: int) -> int:
        self.pending = ""
        self.emit("}")
        self.flush_args()
        self.events.append(ToolCallEnd(self.index))
        self.index += 1
        self.confirmed = False
        self.mode = _AFTER_CALL
        return i + 1

    def after_call(self, text: str, i: int) -> int:
        c = text[i]
        if c in _WS:
            self.hold(c)
            return i + 1
        if c == ",":
            self.hold(c)
            self.mode = _ITEM
            return i + 1
        if c == "]":
            return self.close_list(i)
        self.mode = _CONTENT
        return i

    def close_list(self, i: int) -> int:
        self.raw = ""
        self.mode = _DONE
        return i + 1

    def done(self, text: str, i: int) -> int:
        c = text[i]
        if c in _WS:
            self.hold(c)
            return i + 1
        self.mode = _CONTENT
        return i

    # -- values ------------------------------------------------------------------------

    def value(self, text: str, i: int) -> int:
        c = text[i]
        if c in _WS:
            self.hold(c)
            return i + 1
        if c.isdigit() or c == ".":
            self.word = ""
            self.mode = _NUM
            return i
        if c in "+-" and not self.key_mode:
            self.hold(c)
            self.signed = True
            if c == "-":
                self.negative = not self.negative
            return i + 1
        if self.signed:
            self.fail()
            return i
        if c in "'\"":
            return self.open_quote(text, i, "")
        if c.isalpha() or c == "_":
            self.word = ""
            self.mode = _WORD
            return i
        frames = self.frames
        top = frames[-1:]
        if self.key_mode:
            if c == "}" and top in "qdD" and not self.key:
                return self.close_container(i)  # "{}", or after a trailing comma
            self.fail()
            return i
        if c in "[({" and len(frames) >= _MAX_DEPTH:
            self.fail()
            return i
        if c in "[(":
            self.hold(c)
            self.emit("[")
            self.frames = frames + ("l" if c == "[" else "t")
            return i + 1
        if c == "{":
            self.hold(c)
            self.frames = frames + "q"
            self.key_mode = True
            self.key = ""
            return i + 1
        if top and top in "ltsLTS" and c == _CLOSERS[top.lower()]:
            return self.close_container(i)  # an empty container, or after a trailing comma
        self.fail()
        return i

    def close_container(self, i: int) -> int:
        frame = self.frames[-1]
        self.frames = self.frames[:-1]
        self.pending = "" if frame != "q" else self.pending
        self.key_mode = False
        self.hold(_CLOSERS[frame.lower()])
        self.value_text("{}" if frame == "q" else ("}" if frame in "dD" else "]"))
        self.mode = _AFTER
        return i + 1

    def open_quote(
        self, text: str, i: int, prefix: str = "", unheld: str = "", resume: int | None = None
    ) -> int:
        """`text[i]` is a quote opening a literal after `prefix` (e.g. "r").

        `unheld` is the part of the prefix not held yet; `resume` is where to read again when
        the next chunk is needed to tell a triple quote.
        """
        q = text[i]
        rest = len(text) - i
        if rest < 3 and text.count(q, i) == rest and not self.final:
            return self.need_more(text, i if resume is None else resume)
        if "b" in prefix.lower():
            self.fail()
            return i
        quote = q * 3 if text.startswith(q * 3, i) else q
        self.hold(unheld + quote)
        self.quote = quote
        self.raw_string = "r" in prefix.lower()
        self.f_string = "f" in prefix.lower()
        self.word = ""
        if self.mode != _STR_END:
            self.value_text('"')
        self.mode = _STR
        return i + len(quote)

    def string(self, text: str, i: int) -> int:
        quote = self.quote
        q = quote[0]
        stops = _STOPS_F[q] if self.f_string else _STOPS[q]
        n = len(text)
        while i < n:
            m = stops.search(text, i)
            j = m.start() if m is not None else n
            if j > i:
                self.hold(text[i:j])
                self.string_text(text[i:j])
                i = j
                if i >= n:
                    break
            c = text[i]
            if c == "\\":
                end, decoded, state = _escape(text, i, self.raw_string, self.final)
                if state == _NEED_MORE:
                    return self.need_more(text, i)
                if state == _BAD:
                    self.fail()
                    return i
                self.hold(text[i:end])
                self.string_text(decoded)
                i = end
            elif c == "\n":
                if len(quote) == 1:
                    self.fail()
                    return i
                self.hold(c)
                self.string_text(c)
                i += 1
            elif c == q:
                if len(quote) == 1 or text.startswith(quote, i):
                    self.hold(quote)
                    self.mode = _STR_END
                    return i + len(quote)
                if n - i < 3 and text.count(q, i) == n - i and not self.final:
                    return self.need_more(text, i)  # maybe the closing quotes
                self.hold(c)
                self.string_text(c)
                i += 1
            else:  # an f-string brace: doubled it is the character, alone a placeholder
                if i + 1 >= n and not self.final:
                    return self.need_more(text, i)
                if i + 1 < n and text[i + 1] == c:
                    self.hold(c + c)
                    self.string_text(c)
                    i += 2
                else:
                    self.fail()
                    return i
        return i

    def string_text(self, chars: str) -> None:
        self.value_text(_json_chars(chars))

    def string_end(self, text: str, i: int) -> int:
        """After a literal: another literal continues the same string, else it ends."""
        c = text[i]
        if c in _WS:
            self.hold(c)
            return i + 1
        if c in "'\"":
            return self.open_quote(text, i, "")
        if c.isalpha():
            end = _WORD_CHARS.match(text, i).end()  # type: ignore[union-attr]
            if end >= len(text) and not self.final:
                return self.need_more(text, i)
            word = text[i:end]
            if end < len(text) and text[end] in "'\"" and word.lower() in _PREFIXES:
                return self.open_quote(text, end, word, unheld=word, resume=i)
            self.fail()
            return i
        self.value_text('"')
        self.mode = _AFTER
        return i

    def number(self, text: str, i: int) -> int:
        n = len(text)
        j = i
        word = self.word
        while j < n:
            c = text[j]
            if (
                c.isalnum()
                or c in "._"
                or (
                    c in "+-"
                    and (word + text[i:j])[-1:] in ("e", "E")
                    and not _is_hex(word + text[i:j])
                )
            ):
                j += 1
            else:
                break
        self.word = word + text[i:j]
        self.hold(text[i:j])
        if len(self.word) > _MAX_HELD:
            self.fail()
        elif j < n:
            self.end_number()
        return j

    def end_number(self) -> None:
        literal = _number(self.word, self.negative)
        self.word = ""
        self.negative = self.signed = False
        if literal is None:
            self.fail()
            return
        self.value_text(literal)
        self.mode = _AFTER

    def read_word(self, text: str, i: int) -> int:
        end = _WORD_CHARS.match(text, i).end()  # type: ignore[union-attr]
        self.word += text[i:end]
        self.hold(text[i:end])
        if len(self.word) > _MAX_HELD:
            self.fail()
            return end
        if end >= len(text):
            if not self.final:
                return end
        elif text[end] in "'\"" and self.word.lower() in _PREFIXES and not self.signed:
            return self.open_quote(text, end, self.word, resume=end)
        literal = _NAMES.get(self.word)
        self.word = ""
        if literal is None:
            self.fail()
            return end
        self.value_text(literal)
        self.mode = _AFTER
        return end

    def after(self, text: str, i: int) -> int:
        c = text[i]
        if c in _WS:
            self.hold(c)
            return i + 1
        frames = self.frames
        if not frames:  # directly in the call's arguments
            if c == ",":
                self.hold(c)
                self.mode = _ARGS
                return i + 1
            if c == ")":
                return self.end_call(i)
            self.fail()
            return i
        top = frames[-1]
        if self.key_mode:
            return self.after_key(c, i)
        if c == ",":
            self.hold(c)
            if top in "dD":
                self.key_mode = True
                self.key = ""
            else:
                self.pending = ", "
            self.frames = frames[:-1] + top.upper()
            self.mode = _VALUE
            return i + 1
        if c == _CLOSERS[top.lower()]:
            return self.close_container(i)
        self.fail()
        return i

    def after_key(self, c: str, i: int) -> int:
        """After a dict key, or the first element of a brace (which decides dict or set)."""
        frames = self.frames
        top = frames[-1]
        key = self.key
        if c == ":":
            self.hold(c)
            as_key = key if key.startswith('"') else '"' + key + '"'
            self.pending += ("{" if top == "q" else ", ") + as_key + ": "
            self.frames = frames[:-1] + ("d" if top == "q" else "D")
            self.key_mode = False
            self.key = ""
            self.mode = _VALUE
            return i + 1
        if top == "q" and c in ",}":  # a set: its first element was read like a key
            self.key_mode = False
            self.key = ""
            self.frames = frames[:-1] + "S"
            self.emit("[" + key)
            if c == "}":
                return self.close_container(i)
            self.hold(c)
            self.pending = ", "
            self.mode = _VALUE
            return i + 1
        self.fail()
        return i

    # -- end of output -----------------------------------------------------------------

    def finish(self) -> None:
        if self.mode == _JSON and self.json is not None:
            self.events.extend(_call_list.close(self.json))
            return
        if self.mode == _NUM and self.word:
            self.end_number()
        elif self.mode == _STR_END:
            self.value_text('"')
            self.mode = _AFTER
        self.flush_args()
        held = self.mode not in (_DONE, _AFTER_CALL) and not self.confirmed
        self.end_open_call()
        if held:
            self.content(self.raw)
        self.raw = ""


_DISPATCH = {
    _LEAD: _Scanner.lead,
    _ITEM: _Scanner.item,
    _NAME: _Scanner.read_name,
    _NAME_WS: _Scanner.name_ws,
    _ARGS: _Scanner.args_start,
    _KW: _Scanner.keyword,
    _KW_WS: _Scanner.keyword_ws,
    _VALUE: _Scanner.value,
    _STR: _Scanner.string,
    _STR_END: _Scanner.string_end,
    _NUM: _Scanner.number,
    _WORD: _Scanner.read_word,
    _AFTER: _Scanner.after,
    _AFTER_CALL: _Scanner.after_call,
    _DONE: _Scanner.done,
}

# Characters a string chunk may not contain for the fast path: escapes, quotes, newlines,
# JSON escapes, f-string braces.
_PLAIN = {
    False: re.compile(r"[\\\n'\"\x00-\x1f\ud800-\udfff]"),
    True: re.compile(r"[\\\n'\"{}\x00-\x1f\ud800-\udfff]"),
}
_STOPS = {q: re.compile(r"[\\\n" + q + "]") for q in "'\""}
_STOPS_F = {q: re.compile(r"[\\\n{}" + q + "]") for q in "'\""}
_NEED_MORE = 0  # escape states
_BAD = 1
_OK = 2


def _escape(text: str, i: int, raw: bool, final: bool) -> tuple[int, str, int]:
    """Read the backslash escape at `text[i]`: (end, decoded text, state)."""
    n = len(text)
    if i + 1 >= n:
        return i, "", _BAD if final else _NEED_MORE
    kind = text[i + 1]
    if raw:  # raw strings keep the backslash; it only stops the next quote from closing
        return i + 2, text[i : i + 2], _OK
    if kind == "\n":
        return i + 2, "", _OK
    simple = _SIMPLE_ESCAPES.get(kind)
    if simple is not None:
        return i + 2, simple, _OK
    if kind in _OCT:
        j = i + 1
        while j < n and j < i + 4 and text[j] in _OCT:
            j += 1
        if j == n and j < i + 4 and not final:
            return i, "", _NEED_MORE
        return j, chr(int(text[i + 1 : j], 8)), _OK
    if kind in _HEX_SIZES:
        size = _HEX_SIZES[kind]
        digits = text[i + 2 : i + 2 + size]
        if any(d not in _HEX for d in digits):
            return i, "", _BAD
        if len(digits) < size:
            return i, "", _BAD if final else _NEED_MORE
        code = int(digits, 16)
        if code > 0x10FFFF:
            return i, "", _BAD
        return i + 2 + size, chr(code), _OK
    if kind == "N":
        if i + 2 >= n:
            return i, "", _BAD if final else _NEED_MORE
        if text[i + 2] != "{":
            return i, "", _BAD
        close_at = text.find("}", i + 3)
        if close_at < 0:
            return i, "", _BAD if final or n - i > _MAX_HELD else _NEED_MORE
        try:
            return close_at + 1, unicodedata.lookup(text[i + 3 : close_at]), _OK
        except KeyError:
            return i, "", _BAD
    return i + 2, text[i : i + 2], _OK  # an unknown escape keeps its backslash


_HEX_SIZES = {"x": 2, "u": 4, "U": 8}


def _json_chars(chars: str) -> str:
    """Characters of a JSON string as `json.dumps(..., ensure_ascii=False)` writes them."""
    if not _JSON_ESCAPES.search(chars):
        return chars
    out = json.dumps(chars, ensure_ascii=False)[1:-1]
    # A lone surrogate cannot be sent as UTF-8: keep it as a JSON escape.
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", out)


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _is_hex(word: str) -> bool:
    return word[:2] in ("0x", "0X")


def _number(word: str, negative: bool) -> str | None:
    """JSON of a Python number literal (with its unary sign), or None if it is not one."""
    if word.isdigit() and (word[0] != "0" or len(word) == 1) and len(word) < 20:
        return "-" + word if negative and word != "0" else word
    if word.startswith("_") or word.endswith("_") or "__" in word or word.endswith(("j", "J")):
        return None
    try:
        is_float = not _is_hex(word) and any(c in word for c in ".eE")
        value: float | int = float(word) if is_float else int(word, 0)
    except ValueError:
        return None
    return json.dumps(-value if negative else value)


def _named(call: PythonicCall, text: str) -> tuple[PythonicCall, list[Event]]:
    """A named tool choice: vLLM takes the whole answer as that call's arguments."""
    if not text:
        return call, []
    if call.confirmed:
        return call, [ToolArgsDelta(call.index, text)]
    events: list[Event] = [ToolCallStart(call.index, call.name), ToolArgsDelta(call.index, text)]
    return msgspec.structs.replace(call, confirmed=True), events


class PythonicTools(ToolFamily, frozen=True):
    """No marker tokens: the answer is the call list. Configured by the request's tool choice."""

    choice: str = "auto"
    named_tool: str = ""
    family: str = "pythonic"

    #: The answer state gives back text that is not a call itself.
    drops_text_after_calls: ClassVar[bool] = False

    def markers(self) -> tuple[Marker, ...]:
        """No token announces the calls."""
        return ()

    def bind(self, request: ParseRequest, reasoning: ReasoningFamily | None) -> PythonicTools:
        """Capture the tool choice: a named tool or "required" changes what the answer is."""
        choice = request.effective_tool_choice
        if choice == "named":
            return _NamedTools(choice=choice, named_tool=request.named_tool or "")
        return self if choice == self.choice else PythonicTools(choice=choice)

    def begin(self, index: int) -> PythonicCall:
        """Not reached (no start marker); a fresh answer state."""
        return PythonicCall(index=index)

    def begin_answer(self, index: int) -> PythonicCall:
        """The answer starts: it may be a call list."""
        if self.choice == "named":
            return PythonicCall(index=index, mode=_NAMED, name=self.named_tool)
        return PythonicCall(index=index, required=self.choice == "required")

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        """Scan more of the answer."""
        return scan(call, text) if isinstance(call, PythonicCall) else (call, [])

    def close(self, call: FamilyState) -> list[Event]:
        """End of output."""
        return close(call) if isinstance(call, PythonicCall) else []

    def chunk_content(self, began_in: FamilyState | None, token_ids: Sequence[int]) -> bool:
        """vLLM's pythonic parser answers a chunk that adds nothing with `""` content once the
        answer is plain text or the list closed (`scan` does so for chunks with text)."""
        return isinstance(began_in, PythonicCall) and (
            began_in.mode == _DONE or (began_in.mode == _CONTENT and began_in.plain)
        )

    def render_adjustments(self, request: ParseRequest, strict_level: str) -> RenderAdjustments:
        """vLLM's generic adjust_request: a JSON schema for "required" or a named tool."""
        return RenderAdjustments(json_schema=forced_tool_schema(request))


class _NamedTools(PythonicTools, frozen=True):
    """A named tool choice: vLLM's batch takes the whole answer as the arguments, as text."""

    validates_arguments: ClassVar[bool] = False


def build(facts: TokenizerFacts) -> PythonicTools:
    """The pythonic family needs no marker tokens."""
    return PythonicTools()


def forced_tool_schema(request: ParseRequest) -> dict[str, Any] | None:
    """vLLM's `get_json_schema_from_tools`: the JSON schema that forces a tool choice."""
    choice = request.effective_tool_choice
    functions = [
        t.get("function") or {} for t in request.tools or [] if t.get("type") == "function"
    ]
    if not request.tools or choice not in ("required", "named"):
        return None
    if choice == "named":
        for function in functions:
            if function.get("name") == request.named_tool:
                named: dict[str, Any] = _params_or_empty(function.get("parameters"))
                return named
        return None
    items: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for function in functions:
        params = function.get("parameters")
        if isinstance(params, dict) and "$defs" in params:
            params = dict(params)
            found = params.pop("$defs")
            if isinstance(found, dict):
                defs.update(found)
        items.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [function.get("name")]},
                    "parameters": _params_or_empty(params),
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": items},
    }
    if request.parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _params_or_empty(params: Any) -> Any:
    return params if params else {"type": "object", "properties": {}}
