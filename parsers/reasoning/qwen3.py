"""Qwen3 reasoning: `<think>…</think>` before the answer (vLLM name `qwen3`).

Format (chat template: https://huggingface.co/Qwen/Qwen3-8B/blob/main/tokenizer_config.json):
`<think>\\nreasoning\\n</think>\\n\\nanswer`. Both markers are added tokens. The template
pre-fills `<think>\\n\\n</think>\\n\\n` when `enable_thinking` is false, and the output then
starts as the answer. A `<tool_call>` inside reasoning ends it; a second `</think>` in the
answer is dropped; `<|im_start|>`/`<|im_end|>` bound the prompt look-back.
"""

from __future__ import annotations

from parsers.facts import TokenizerFacts
from parsers.family import ReasoningFamily

__all__ = ["build"]


def build(facts: TokenizerFacts) -> ReasoningFamily:
    """Qwen3's reasoning configuration for this tokenizer."""
    boundaries = (facts.optional_id(t) for t in ("<|im_start|>", "<|im_end|>"))
    return ReasoningFamily(
        family="qwen3",
        start_id=facts.marker_id("<think>", "qwen3"),
        start_text="<think>",
        end_id=facts.marker_id("</think>", "qwen3"),
        end_text="</think>",
        honours_enable_thinking=True,
        tool_start_ends_reasoning=True,
        drop_end_in_content=True,
        keeps_special_tokens=True,
        boundary_ids=frozenset(b for b in boundaries if b is not None),
        tool_start_id=facts.optional_id("<tool_call>"),
        tool_end_id=facts.optional_id("</tool_call>"),
    )
