"""Reasoning families: `<think>`-style sections before the answer.

A family is a `ReasoningFamily` configuration (`parsers/family.py`); `ReasoningConfig` is the
same class under the name earlier code used.
"""

from __future__ import annotations

from parsers.family import ReasoningFamily, prompt_closes_reasoning

__all__ = ["ReasoningConfig", "ReasoningFamily", "prompt_closes_reasoning"]

ReasoningConfig = ReasoningFamily
