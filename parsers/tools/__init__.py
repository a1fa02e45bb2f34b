"""Tool-call families: each is a config Struct (begin/feed/close) and a call-state Struct."""

from __future__ import annotations

from typing import TypeAlias

from parsers.tools.hermes import HermesCall, HermesConfig
from parsers.tools.llama3_json import LlamaCall, LlamaConfig
from parsers.tools.qwen3_coder import XmlCall, XmlConfig

__all__ = ["ToolCallState", "ToolConfig"]

ToolConfig: TypeAlias = HermesConfig | XmlConfig | LlamaConfig
ToolCallState: TypeAlias = HermesCall | XmlCall | LlamaCall
