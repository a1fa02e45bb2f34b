"""The seam between render_service and the ``parsers`` package: the server's parser flags, the
model's marker tokens, one parser per parse request, and how a chat request's tool choice reads."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from parsers import (
    ChatParser,
    ParseRequest,
    RenderAdjustments,
    TokenizerFacts,
    build_chat_parser,
)
from render_service.caches import ByteLRU
from render_service.errors import invalid_param
from render_service.model.harmony import token_bytes
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.generate import ParseContext
from render_service.settings import DEFAULTS

if TYPE_CHECKING:
    from render_service.model.loading import Model
    from render_service.settings import Settings

#: The parser names of Harmony models (gpt-oss), as vLLM 0.33 spells them.
HARMONY_REASONING = "openai_gptoss"
HARMONY_TOOLS = "openai"
_PARSE_REQUEST_ENCODER = msgspec.msgpack.Encoder()
# A cached parser's memory, estimated from its key (the encoded parse request: tool names and
# schemas, which the parser keeps in its own forms): this multiple of the key, plus overhead.
_PARSER_BYTES_PER_KEY_BYTE = 4
_PARSER_OVERHEAD_BYTES = 4096


def parser_flags(settings: Settings) -> tuple[str | None, str | None]:
    """The reasoning and tool parser names the flags ask for (None: no such parser)."""
    reasoning = settings.reasoning_parser
    tool = settings.tool_call_parser if settings.enable_auto_tool_choice else None
    return (reasoning if reasoning not in (None, "", "none") else None), tool


def harmony_parser_flags(settings: Settings) -> tuple[str, str | None]:
    """The parser names for a gpt-oss (Harmony) model: vLLM picks its Harmony reasoning parser
    itself and refuses any other family (ValueError, with the flags to use)."""
    reasoning, tool = parser_flags(settings)
    reasoning = reasoning or HARMONY_REASONING
    if reasoning != HARMONY_REASONING or tool not in (None, HARMONY_TOOLS):
        raise ValueError(
            f"gpt-oss output is Harmony: use --reasoning-parser {HARMONY_REASONING} "
            f"(the default) and --tool-call-parser {HARMONY_TOOLS}"
        )
    return reasoning, tool


class ParserKey(NamedTuple):
    """What the parser cache keys a parse request by: a digest of its encoding, and the
    encoding's length (the cached parser's size is estimated from it)."""

    digest: bytes
    size: int


def parser_key(request: ParseRequest) -> ParserKey:
    """The key of ``request``'s parser; a stream computes it once and reuses it every chunk."""
    encoded = _PARSE_REQUEST_ENCODER.encode(request)
    return ParserKey(hashlib.blake2b(encoded, digest_size=16).digest(), len(encoded))


@dataclass(frozen=True)
class RenderHints:
    """What the configured parsers change in a rendered request (vLLM's adjust_request)."""

    reasoning_ended: bool | None = None
    skip_special_tokens: bool | None = None
    structural_tag: str | None = None
    json_schema: dict[str, Any] | None = None


class ParsingSetup:
    """The server's parser flags plus the model's marker tokens, and the parsers built so far.

    Parsers are configuration only (no per-stream state), so requests with the same parse
    request share one; the most recently used are kept within ``cache_bytes`` (thread-safe).
    """

    def __init__(
        self,
        reasoning_parser: str | None,
        tool_parser: str | None,
        facts: TokenizerFacts,
        cache_bytes: int = DEFAULTS["small_cache_bytes"],
        tool_strict_level: str | None = None,
    ) -> None:
        self.reasoning_parser = reasoning_parser
        self.tool_parser = tool_parser
        self.tool_strict_level = tool_strict_level
        self.facts = facts
        self.parsers: ByteLRU[bytes, tuple[ChatParser | None]] = ByteLRU("parsers", cache_bytes)

    @property
    def has_reasoning(self) -> bool:
        return self.reasoning_parser is not None

    @property
    def has_tools(self) -> bool:
        return self.tool_parser is not None

    @classmethod
    def create(cls, model: Model, settings: Settings) -> ParsingSetup | None:
        """The setup for the server's flags, or None without parsers; the parsers are built
        once here, so a family that cannot serve this model fails at startup."""
        reasoning, tool = parser_flags(settings)
        table: tuple[bytes, ...] = ()
        if model.harmony is not None:
            reasoning, tool = harmony_parser_flags(settings)
            table = token_bytes(model.hf_backend)
        if reasoning is None and tool is None:
            return None
        facts = TokenizerFacts.from_added_tokens(
            model.added_tokens(), model.special_ids(), token_bytes=table
        )
        setup = cls(
            reasoning,
            tool,
            facts,
            settings.small_cache_bytes,
            tool_strict_level=settings.tool_strict_level,
        )
        setup.parser(ParseRequest())
        return setup

    def parse_request(self, context: ParseContext | dict[str, Any]) -> ParseRequest:
        data = msgspec.to_builtins(context) if isinstance(context, ParseContext) else context
        return msgspec.convert({**data, "enable_auto_tools": self.has_tools}, ParseRequest)

    def parser(self, request: ParseRequest, key: ParserKey | None = None) -> ChatParser | None:
        """The parser for a request (``key``: its ``parser_key``, if known); streams reuse one
        per distinct parse request."""
        if key is None:
            key = parser_key(request)
        cached = self.parsers.get(key.digest)
        if cached is not None:
            return cached[0]
        # Two threads may build the same parser once each.
        parser = build_chat_parser(
            self.reasoning_parser,
            self.tool_parser,
            self.facts,
            request,
            tool_strict_level=self.tool_strict_level,
        )
        size = _PARSER_BYTES_PER_KEY_BYTE * key.size + _PARSER_OVERHEAD_BYTES
        self.parsers.put(key.digest, (parser,), size)
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
            json_schema=adjustments.json_schema,
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
