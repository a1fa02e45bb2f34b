"""DeepSeek-V3.1 tool calls: one section of `NAME<｜tool▁sep｜>ARGS` calls (vLLM name `deepseek_v31`).

Format (chat template in https://huggingface.co/deepseek-ai/DeepSeek-V3.1/blob/main/tokenizer_config.json)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(one line in the model's output). All five markers are added tokens, matched by id: the
section opens at `<｜tool▁calls▁begin｜>` and closes at `<｜tool▁calls▁end｜>`; each call is
its name, `<｜tool▁sep｜>`, then its arguments up to `<｜tool▁call▁end｜>`. Arguments pass
through as written (JSON, Python literals or prose alike: vLLM does not validate them), so
nothing is held back; the state is the mode, the next call's index and the name being read.

Recovery, for output that breaks the format (each case named in docs/compat.md):

* a call whose `<｜tool▁call▁end｜>` is missing ends at the next call or at the section's end;
* a call cut before its `<｜tool▁sep｜>` (by max_tokens, or a closing marker), a call with an
  empty name, a name with a line break or one longer than `MAX_NAME` characters is no call
  (vLLM drops these too) and uses no index;
* text inside the section but outside a call (between calls) is content, as is text after
  the section; a stray `<｜tool▁call▁end｜>` outside a call is dropped, as vLLM's streaming
  does; a second `<｜tool▁calls▁begin｜>` inside the section is dropped, as vLLM's streaming
  removes it from every delta (an open call or name goes on).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec

from parsers.events import ContentDelta, Event, ToolArgsDelta, ToolCallEnd, ToolCallStart
from parsers.facts import TokenizerFacts
from parsers.family import FamilyState, Marker, ToolFamily
from parsers.request import ParseRequest
from parsers.structural_tag import constrained_functions, json_content

__all__ = [
    "CALLS_BEGIN",
    "CALLS_END",
    "CALL_BEGIN",
    "CALL_END",
    "MAX_NAME",
    "SEP",
    "DeepSeekV31Family",
    "DeepSeekV31Section",
    "build",
    "section_structural_tag",
]

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

#: Longest function name read; a longer one is no call (OpenAI allows 64 characters).
MAX_NAME = 256

# Modes inside the section.
_BETWEEN = 0  # outside any call: text is content
_NAME = 1  # after <｜tool▁call▁begin｜>, reading the name up to <｜tool▁sep｜>
_ARGS = 2  # after <｜tool▁sep｜>: text is the arguments
_SKIP = 3  # a call that is no call: ignored up to its end


class DeepSeekV31Section(FamilyState, frozen=True, tag="deepseek_v31", gc=False):
    """State inside one `<｜tool▁calls▁begin｜>` section; holds at most one partial name.

    `index` is the index the next call will get: the open call in `_ARGS` mode is `index - 1`.
    """

    index: int
    mode: int = _BETWEEN
    name: str = ""

    @property
    def in_call(self) -> bool:
        """Inside a call's markup (name, arguments or an ignored call)."""
        return self.mode != _BETWEEN


class DeepSeekV31Family(ToolFamily, frozen=True):
    """The five marker ids of one tokenizer."""

    calls_begin: int
    calls_end: int
    call_begin: int
    call_end: int
    sep: int

    #: Text after the section is content (vLLM streams it; its batch drops it: docs/compat.md).
    drops_text_after_calls: ClassVar[bool] = False
    #: vLLM's batch takes arguments as text and drops calls without `<｜tool▁call▁end｜>`.
    validates_arguments: ClassVar[bool] = False

    def markers(self) -> tuple[Marker, ...]:
        """The section markers open and close the state; the call markers are inner."""
        return (
            Marker(self.calls_begin, CALLS_BEGIN, "start"),
            Marker(self.calls_end, CALLS_END, "end"),
            Marker(self.call_begin, CALL_BEGIN, "inner"),
            Marker(self.call_end, CALL_END, "inner"),
            Marker(self.sep, SEP, "inner"),
        )

    def begin(self, index: int) -> FamilyState:
        """The section opened; its first call gets `index`."""
        return DeepSeekV31Section(index=index)

    def feed(self, call: FamilyState, text: str) -> tuple[FamilyState, list[Event]]:
        """Text inside the section."""
        if not isinstance(call, DeepSeekV31Section):
            return call, []
        return _section_text(call, text.replace(CALLS_BEGIN, ""))

    def start_is_text(self, call: FamilyState) -> bool:
        """A second `<｜tool▁calls▁begin｜>` does not reopen the section (`feed` drops it)."""
        return isinstance(call, DeepSeekV31Section)

    def marker(
        self, call: FamilyState, token_id: int, text: str
    ) -> tuple[FamilyState, list[Event]]:
        """A call marker inside the section."""
        if not isinstance(call, DeepSeekV31Section):
            return call, []
        return _section_marker(call, text)

    def close(self, call: FamilyState) -> list[Event]:
        """`<｜tool▁calls▁end｜>` or the end of output: end an open call."""
        if not isinstance(call, DeepSeekV31Section):
            return []
        return _end_call(call)

    def structural_tag(self, request: ParseRequest, strict_level: str) -> str | None:
        """xgrammar's `deepseek_v3_1` structural tag, as vLLM 0.33 renders it."""
        return section_structural_tag(request, strict_level)

    def chunk_content(self, began_in: FamilyState | None, token_ids: Sequence[int]) -> bool:
        """vLLM's streaming answers a chunk with content, even "", unless a call is involved.

        Its deepseek_v31 parser returns the chunk's text (markers of the section removed) for
        every chunk outside a call that holds no `<｜tool▁call▁begin｜>`/`<｜tool▁call▁end｜>`:
        the lone section markers and the stop token come out as `content: ""`.
        """
        if isinstance(began_in, DeepSeekV31Section) and began_in.in_call:
            return False
        return self.call_begin not in token_ids and self.call_end not in token_ids


def build(facts: TokenizerFacts) -> DeepSeekV31Family:
    """DeepSeek-V3.1's tool-call markers for this tokenizer; the family needs all five."""
    return DeepSeekV31Family(
        calls_begin=facts.marker_id(CALLS_BEGIN, "deepseek_v31"),
        calls_end=facts.marker_id(CALLS_END, "deepseek_v31"),
        call_begin=facts.marker_id(CALL_BEGIN, "deepseek_v31"),
        call_end=facts.marker_id(CALL_END, "deepseek_v31"),
        sep=facts.marker_id(SEP, "deepseek_v31"),
    )


def _section_text(section: DeepSeekV31Section, text: str) -> tuple[DeepSeekV31Section, list[Event]]:
    """Plain text inside the section (no marker tokens in it)."""
    if not text:
        return section, []
    mode = section.mode
    if mode == _ARGS:
        return section, [ToolArgsDelta(section.index - 1, text)]
    if mode == _BETWEEN:
        return section, [ContentDelta(text)]
    if mode == _NAME:
        name = section.name + text
        if "\n" in name or len(name) > MAX_NAME:
            return msgspec.structs.replace(section, mode=_SKIP, name=""), []
        return msgspec.structs.replace(section, name=name), []
    return section, []


def _section_marker(
    section: DeepSeekV31Section, spelling: str
) -> tuple[DeepSeekV31Section, list[Event]]:
    """A call marker inside the section, by its spelling."""
    if spelling == CALL_BEGIN:
        return DeepSeekV31Section(index=section.index, mode=_NAME), _end_call(section)
    if spelling == CALL_END:
        return DeepSeekV31Section(index=section.index), _end_call(section, complete=True)
    if section.mode != _NAME:
        # A separator outside a name is text of what it stands in (arguments, or content).
        return _section_text(section, spelling)
    if not section.name:
        return msgspec.structs.replace(section, mode=_SKIP), []
    started = DeepSeekV31Section(index=section.index + 1, mode=_ARGS)
    return started, [ToolCallStart(section.index, section.name)]


def _end_call(section: DeepSeekV31Section, complete: bool = False) -> list[Event]:
    """End the open call; it is complete only at its own `<｜tool▁call▁end｜>`."""
    if section.mode == _ARGS:
        return [ToolCallEnd(section.index - 1, complete=complete)]
    return []


def section_structural_tag(request: ParseRequest, strict_level: str) -> str | None:
    """xgrammar's `deepseek_v3_1` structural tag, as vLLM 0.33 renders it, or None.

    "auto": calls triggered by `<｜tool▁calls▁begin｜>`, one section of one or more calls;
    "required": that section itself; a named tool: the one call with both markers around it.
    `parallel_tool_calls=false` stops after the first call.
    """
    constrained = constrained_functions(request, strict_level)
    if constrained is None:
        return None
    functions, level = constrained
    choice = request.effective_tool_choice
    single = request.parallel_tool_calls is False
    if choice == "named":
        if not functions:
            return None
        function = functions[0]
        fmt: dict[str, Any] = {
            "type": "tag",
            "begin": f"{CALLS_BEGIN}{CALL_BEGIN}{function.get('name', '')}{SEP}",
            "content": json_content(function, level),
            "end": f"{CALL_END}{CALLS_END}",
        }
        return json.dumps({"type": "structural_tag", "format": fmt})
    calls = {
        "type": "tags_with_separator",
        "tags": [
            {
                "type": "tag",
                "begin": f"{CALL_BEGIN}{function.get('name', '')}{SEP}",
                "content": json_content(function, level),
                "end": CALL_END,
            }
            for function in functions
        ],
        "separator": "",
        "at_least_one": True,
        "stop_after_first": single,
    }
    section = {"type": "tag", "begin": CALLS_BEGIN, "content": calls, "end": CALLS_END}
    if choice == "required":
        return json.dumps({"type": "structural_tag", "format": section})
    fmt = {
        "type": "triggered_tags",
        "triggers": [CALLS_BEGIN],
        "tags": [section],
        "at_least_one": False,
        "stop_after_first": single,
        "excludes": ["<think>", "</think>"],
    }
    return json.dumps({"type": "structural_tag", "format": fmt})
