"""Families that vLLM parses with one engine for reasoning and tools (`parsers._tag_engine`).

vLLM 0.33 parses GLM-4.5 and MiniMax-M2 with its declarative parser engine; their
`--reasoning-parser` and `--tool-call-parser` rows are two halves of it. Here each half is an
`EngineFamily` (a `ChatFamily`: it parses the whole output itself), and `bind` joins the
configured halves into `BoundEngine`, the parser of one request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

from parsers import _tag_engine as engine
from parsers._tag_engine import EngineConfig, EngineSpec, EngineState
from parsers.errors import ParserConfigError
from parsers.events import Event
from parsers.family import ChatFamily, Family, FamilyState
from parsers.request import ParseRequest
from parsers.structural_tag import RenderAdjustments

__all__ = ["BoundEngine", "EngineFamily", "resolve_tools"]

#: Builds a family's structural tag: (function tools with `strict` pinned, simplified tool
#: choice "auto" / "required" / "forced") -> the tag's format as plain data.
TagBuilder = Callable[[list[dict[str, Any]], str], dict[str, Any]]

_LEVELS = {"auto": 0, "function": 1, "parameter": 2}
_LIST_FORMATS = ("triggered_tags", "tags_with_separator")


class EngineFamily(ChatFamily, frozen=True, dict=True):
    """One registry row's value: the reasoning or the tool half of an engine family.

    A family module subclasses it to set `default_strict_level` (vLLM's
    `default_tool_strict_level` for the tool parser).
    """

    spec: EngineSpec
    role: Literal["reasoning", "tool"]
    #: `enable_thinking: false` / `thinking: false` turns reasoning off (GLM).
    honours_enable_thinking: bool = False
    #: MiniMax's `minimax_m2_append_think`: the reasoning stays content after "<think>".
    append_think: bool = False
    #: The tool half's structural tag (vLLM's `structural_tag_model`), or None.
    tag_builder: TagBuilder | None = None

    def bind(
        self, request: ParseRequest, reasoning: Family | None, tools: Family | None
    ) -> BoundEngine:
        """The parser of one request: the configured halves, which must be of this family."""
        for half in (reasoning, tools):
            if half is not None and not (
                isinstance(half, EngineFamily) and half.spec.family == self.spec.family
            ):
                raise ParserConfigError(
                    f"the {self.spec.family!r} parser combines only with its own other half"
                )
        assert reasoning is None or isinstance(reasoning, EngineFamily)
        assert tools is None or isinstance(tools, EngineFamily)
        thinking = reasoning is not None and (
            not reasoning.honours_enable_thinking or _thinking(request.chat_template_kwargs)
        )
        config = engine.bind(
            self.spec,
            request,
            reasoning=thinking,
            tools=tools is not None,
            append_think=reasoning is not None and reasoning.append_think,
        )
        return BoundEngine(config=config, request=request, reasoning=reasoning, tools=tools)


class BoundEngine(ChatFamily, frozen=True, dict=True):
    """An engine family bound to one request: configuration only."""

    engine: ClassVar[bool] = True
    tool_schemas: ClassVar[bool] = True  # values are typed by the schemas, chunk by chunk

    config: EngineConfig
    request: ParseRequest
    reasoning: EngineFamily | None
    tools: EngineFamily | None

    def marker_ids(self) -> frozenset[int]:
        """Marker token ids (a caller may split chunks at them)."""
        return frozenset(self.config.spec.markers)

    def start(self, prompt_token_ids: Sequence[int]) -> FamilyState:
        """Initial state: inside reasoning unless the prompt or the template closed it."""
        return engine.start(self.config, prompt_token_ids)

    def feed(
        self, state: FamilyState, token_ids: Sequence[int], text: str
    ) -> tuple[FamilyState, list[Event]]:
        """Parse one chunk: `text` is the decode of exactly `token_ids`, special tokens kept."""
        assert isinstance(state, EngineState)
        return engine.feed(self.config, state, token_ids, text)

    def finish(self, state: FamilyState) -> tuple[FamilyState, list[Event]]:
        """End of output: flush what was held back and end an open call."""
        assert isinstance(state, EngineState)
        return engine.finish(self.config, state)

    def reasoning_ended(self, prompt_token_ids: Sequence[int]) -> bool | None:
        """vLLM's `is_reasoning_end(prompt)` of the reasoning half; None without one."""
        config = self.config
        if self.reasoning is None:
            return None
        if config.append_think:
            return engine.start(config, prompt_token_ids).mode != engine.REASONING
        if not config.reasoning:
            return True  # thinking is off: the engine starts in the content
        return engine.prompt_closes_reasoning(config.spec, prompt_token_ids)

    def render_adjustments(self, strict_level: str) -> RenderAdjustments:
        """Engine parsers keep special tokens; the tool half may add a structural tag."""
        return RenderAdjustments(
            skip_special_tokens=False, structural_tag=self._structural_tag(strict_level)
        )

    def _structural_tag(self, strict_level: str) -> str | None:
        tools = self.tools
        if tools is None or tools.tag_builder is None:
            return None
        resolved = resolve_tools(self.request, strict_level)
        if resolved is None:
            return None
        functions, choice = resolved
        fmt = tools.tag_builder(functions, choice)
        if self.request.parallel_tool_calls is False:
            _stop_after_first(fmt)
        return json.dumps({"type": "structural_tag", "format": fmt})


def _thinking(kwargs: dict[str, Any]) -> bool:
    """GLM's switch: thinking unless `thinking` or `enable_thinking` is given and false."""
    thinking, enable = kwargs.get("thinking"), kwargs.get("enable_thinking")
    if thinking is None and enable is None:
        return True
    return bool(thinking) or bool(enable)


def resolve_tools(
    request: ParseRequest, strict_level: str
) -> tuple[list[dict[str, Any]], str] | None:
    """The function tools a structural tag covers, `strict` pinned, and the simplified tool
    choice; None when vLLM adds no tag.

    vLLM: no tag without tools or with tool_choice "none"; `parallel_tool_calls: false` raises
    the level to "function"; at level "auto" a tool_choice "auto" is unconstrained unless some
    tool is strict; a tool is pinned strict at level "parameter" or when it says so; a named
    choice keeps only that tool.
    """
    choice = request.effective_tool_choice
    if not request.tools or choice == "none":
        return None
    level = _LEVELS.get(strict_level, 0)
    if request.parallel_tool_calls is False:
        level = max(level, _LEVELS["function"])
    functions = [
        dict(tool["function"])
        for tool in request.tools
        if isinstance(tool, dict)
        and tool.get("type", "function") == "function"
        and isinstance(tool.get("function"), dict)
    ]
    if not functions:
        return None
    if choice == "auto" and level == 0 and not any(f.get("strict") is True for f in functions):
        return None
    for function in functions:
        function["strict"] = level >= _LEVELS["parameter"] or function.get("strict") is True
    if choice == "named":
        functions = [f for f in functions if f.get("name") == request.named_tool]
        return (functions, "forced") if functions else None
    return functions, choice


def _stop_after_first(node: object) -> None:
    """`parallel_tool_calls: false`: every list of calls in the tag stops after one."""
    if isinstance(node, dict):
        if node.get("type") in _LIST_FORMATS:
            node["stop_after_first"] = True
        for value in node.values():
            _stop_after_first(value)
    elif isinstance(node, list):
        for item in node:
            _stop_after_first(item)
