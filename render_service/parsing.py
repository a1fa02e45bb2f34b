"""The seam between render_service and the ``parsers`` package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from render_service.protocol.generate import ParseContext

if TYPE_CHECKING:
    from render_service.model import Model
    from render_service.settings import Settings


_SKIPS_SPECIAL_TOKENS = frozenset({"hermes", "qwen3_json", "qwen3_coder", "qwen3_xml"})


@dataclass(frozen=True)
class RenderHints:
    """What the configured parsers change in a rendered request (vLLM's adjust_request)."""

    reasoning_ended: bool | None = None
    skip_special_tokens: bool | None = None
    structural_tag: str | None = None


@dataclass(frozen=True)
class ParsingSetup:
    reasoning_parser: str | None
    tool_parser: str | None

    @property
    def has_reasoning(self) -> bool:
        return self.reasoning_parser is not None

    @property
    def has_tools(self) -> bool:
        return self.tool_parser is not None

    @classmethod
    def create(cls, model: Model, settings: Settings) -> ParsingSetup | None:
        reasoning = (
            settings.reasoning_parser
            if settings.reasoning_parser not in (None, "", "none")
            else None
        )
        tool = settings.tool_call_parser if settings.enable_auto_tool_choice else None
        if reasoning is None and tool is None:
            return None
        return cls(reasoning, tool)

    def render_hints(self, context: ParseContext, prompt_ids: list[int]) -> RenderHints:
        uses_tools = (
            self.tool_parser in _SKIPS_SPECIAL_TOKENS
            and bool(context.tools)
            and context.tool_choice != "none"
        )
        skip = False if self.reasoning_parser == "qwen3" or uses_tools else None
        return RenderHints(skip_special_tokens=skip)
