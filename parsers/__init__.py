"""Streaming reasoning and tool-call parsers whose whole state is a small serializable value.

Pure Python, no I/O; never imports `render_service`. Build a `ChatParser` with
`build_chat_parser`, then `start` / `feed` / `finish` a `ChatState`.
"""

from __future__ import annotations

from parsers.chat import ChatParser, ChatState, build_chat_parser
from parsers.detokenizer import Detokenizer, DetokState
from parsers.errors import ParserConfigError, UnknownParserError, UnsupportedModelError
from parsers.events import (
    ContentDelta,
    Event,
    ReasoningDelta,
    ToolArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from parsers.facts import TokenizerFacts
from parsers.ids import tool_call_id
from parsers.logprob_text import logprob_context, logprob_token_text
from parsers.message import Message, accumulate, batch_message
from parsers.registry import known_reasoning_parsers, known_tool_parsers
from parsers.request import ParseRequest
from parsers.structural_tag import RenderAdjustments

__all__ = [
    "ChatParser",
    "ChatState",
    "ContentDelta",
    "DetokState",
    "Detokenizer",
    "Event",
    "Message",
    "ParseRequest",
    "ParserConfigError",
    "ReasoningDelta",
    "RenderAdjustments",
    "TokenizerFacts",
    "ToolArgsDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "UnknownParserError",
    "UnsupportedModelError",
    "accumulate",
    "batch_message",
    "build_chat_parser",
    "known_reasoning_parsers",
    "known_tool_parsers",
    "logprob_context",
    "logprob_token_text",
    "tool_call_id",
]
