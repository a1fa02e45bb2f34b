"""DeepSeek-R1 reasoning: `…</think>` before the answer (vLLM name `deepseek_r1`).

Format (chat template: https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-7B/blob/main/tokenizer_config.json):
the template ends the prompt with `<think>\\n`, so the output is `reasoning</think>answer`;
a model that repeats `<think>` at the start has it absorbed. No `<think>` needed: output
before `</think>` is reasoning. `enable_thinking` is ignored, a `</think>` in the answer stays
content, and reasoning that closes empty reports `""`.
"""

from __future__ import annotations

from parsers.facts import TokenizerFacts
from parsers.family import ReasoningFamily

__all__ = ["build"]


def build(facts: TokenizerFacts) -> ReasoningFamily:
    """DeepSeek-R1's reasoning configuration for this tokenizer."""
    return ReasoningFamily(
        family="deepseek_r1",
        start_id=facts.marker_id("<think>", "deepseek_r1"),
        start_text="<think>",
        end_id=facts.marker_id("</think>", "deepseek_r1"),
        end_text="</think>",
        report_empty_reasoning=True,
        empty_deltas=True,
        batch_drops_space_before_start=True,
    )
