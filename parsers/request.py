"""The parse-relevant part of a chat request (vLLM's ParseContext plus the auto-tools flag)."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec

__all__ = ["ParseRequest", "ToolChoice"]

ToolChoice: TypeAlias = Literal["none", "auto", "required"] | dict[str, Any] | None


class ParseRequest(msgspec.Struct, frozen=True, omit_defaults=True):
    """Tools, tool choice and template switches that change how output is parsed.

    Field names and defaults mirror vLLM 0.33's `ParseContext` (render's `parse_context`);
    `enable_auto_tools` is the server's `--enable-auto-tool-choice`. A `tool_choice` of None
    means the OpenAI default: "auto" with tools, "none" without.
    """

    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    history_tool_call_cnt: int = 0
    enable_auto_tools: bool = False

    @property
    def effective_tool_choice(self) -> str:
        """ "none", "auto", "required" or "named"."""
        choice = self.tool_choice
        if choice is None:
            return "auto" if self.tools else "none"
        if isinstance(choice, dict):
            return "named"
        return choice

    @property
    def named_tool(self) -> str | None:
        """Function name of a named tool choice, else None."""
        choice = self.tool_choice
        if isinstance(choice, dict):
            function = choice.get("function")
            if isinstance(function, dict):
                name = function.get("name")
                return name if isinstance(name, str) else None
        return None
