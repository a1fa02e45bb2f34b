"""Reasoning families: `<think>`-style sections before the answer."""

from __future__ import annotations

from parsers.reasoning._think import ReasoningConfig, prompt_closes_reasoning

__all__ = ["ReasoningConfig", "prompt_closes_reasoning"]
