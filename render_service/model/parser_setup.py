"""The seam between render_service and the ``parsers`` package: the server's parser flags, the
model's marker tokens, one parser per parse request, and how a chat request's tool choice reads."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from parsers import (
    ChatParser,
    ParseRequest,
    RenderAdjustments,
    TokenizerFacts,
    UnknownParserError,
    build_chat_parser,
    known_tool_parsers,
)
from render_service.errors import invalid_param
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.generate import ParseContext

if TYPE_CHECKING:
    from render_service.model.loading import Model
    from render_service.settings import Settings

log = logging.getLogger("render_service")
_PARSE_REQUEST_ENCODER = msgspec.msgpack.Encoder()
# Parsers are configuration only, so requests with the same parse context share one.
_PARSER_CACHE_SIZE = 512


@dataclass(frozen=True)
class RenderHints:
    """What the configured parsers change in a rendered request (vLLM's adjust_request)."""

    reasoning_ended: bool | None = None
    skip_special_tokens: bool | None = None
    structural_tag: str | None = None


@dataclass(frozen=True)
class ParsingSetup:
    """The server's parser flags plus the model's marker tokens."""

    reasoning_parser: str | None
    tool_parser: str | None
    facts: TokenizerFacts
    #: A tool parser name vLLM knows but this project does not implement yet: render accepts
    #: tool requests (as vLLM would) but cannot add that family's structural tag or parse output.
    tool_parser_supported: bool
    _parsers: dict[bytes, ChatParser | None] = field(
        default_factory=dict, compare=False, repr=False
    )

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
        facts = TokenizerFacts.from_added_tokens(model.added_tokens(), model.special_ids())
        supported = tool is None or tool in known_tool_parsers()
        if not supported:
            log.warning(
                "tool parser %r is not implemented: render only, derender refuses tool output", tool
            )
        setup = cls(reasoning, tool, facts, supported)
        setup.parser(ParseRequest())  # fail at startup, not per request, on unknown names
        return setup

    def parse_request(self, context: ParseContext | dict[str, Any]) -> ParseRequest:
        data = msgspec.to_builtins(context) if isinstance(context, ParseContext) else context
        return msgspec.convert({**data, "enable_auto_tools": self.has_tools}, ParseRequest)

    def parser(self, request: ParseRequest) -> ChatParser | None:
        """The parser for a request; streams reuse one per distinct parse request."""
        return self._parser_for(_PARSE_REQUEST_ENCODER.encode(request))

    def _parser_for(self, encoded: bytes) -> ChatParser | None:
        cache = self._parsers
        if encoded in cache:
            return cache[encoded]
        request = msgspec.msgpack.decode(encoded, type=ParseRequest)
        tool = self.tool_parser if self.tool_parser_supported else None
        try:
            parser = build_chat_parser(self.reasoning_parser, tool, self.facts, request)
        except UnknownParserError as exc:
            raise SystemExit(f"--reasoning-parser/--tool-call-parser: {exc}") from exc
        if len(cache) >= _PARSER_CACHE_SIZE:
            cache.clear()
        cache[encoded] = parser
        return parser

    def render_hints(self, context: ParseContext, prompt_ids: list[int]) -> RenderHints:
        parser = self.parser(self.parse_request(context))
        if parser is None:
            return RenderHints()
        adjustments: RenderAdjustments = parser.render_adjustments()
        return RenderHints(
            reasoning_ended=parser.reasoning_ended(prompt_ids),
            skip_special_tokens=adjustments.skip_special_tokens,
            structural_tag=adjustments.structural_tag,
        )


def resolve_tool_choice(request: ChatCompletionRequest) -> str | dict[str, Any]:
    """Explicit value, or "auto" when tools are given, else "none"."""
    choice = request.tool_choice
    if isinstance(choice, (str, dict)):
        return choice
    return "auto" if request.tools else "none"


def named_tool(choice: str | dict[str, Any]) -> str | None:
    """The function a named ``tool_choice`` forces, or None for a mode ("auto", ...)."""
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            return name
        raise invalid_param(
            "Invalid tool_choice: expected {'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    return None
