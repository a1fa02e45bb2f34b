"""Example family for docs/writing-a-parser.md: `<reasoning>…</reasoning>` before the answer.

A model that differs from Qwen3 only in its marker spellings is a configuration, not code.
tests/parsers/test_writing_a_parser.py imports and runs this file, so it cannot drift.
"""

from __future__ import annotations

from parsers import TokenizerFacts
from parsers.family import ReasoningFamily


def build(facts: TokenizerFacts) -> ReasoningFamily:
    """Configuration of the `mini_think` family for this tokenizer."""
    return ReasoningFamily(
        family="mini_think",
        start_id=facts.marker_id("<reasoning>", "mini_think"),
        start_text="<reasoning>",
        end_id=facts.marker_id("</reasoning>", "mini_think"),
        end_text="</reasoning>",
        honours_enable_thinking=True,
    )
