"""DeepSeek-V3.1 reasoning (vLLM name `deepseek_v3`): R1's `…</think>`, only when thinking is on.

Format (chat template in https://huggingface.co/deepseek-ai/DeepSeek-V3.1/blob/main/tokenizer_config.json):
with `chat_template_kwargs` `thinking` (or `enable_thinking`) true the template ends the prompt
with `<think>` and the output is `reasoning</think>answer`, read as DeepSeek-R1's is; otherwise
the prompt ends with `</think>` and vLLM reads the whole output as the answer (its identity
parser): `<think>`/`</think>` stay in the content and render's `reasoning_ended` is true.

vLLM runs this family with the `deepseek_v31` tool parser, whose streaming decides the empty
deltas of the answer: reasoning that closes empty is not reported, and the answer side has no
R1-style empty deltas (`answer_empty_deltas`); inside reasoning a chunk without text still
yields `reasoning: ""`, as R1's does.
"""

from __future__ import annotations

from collections.abc import Sequence

from parsers.facts import TokenizerFacts
from parsers.family import ReasoningFamily, prompt_closes_reasoning
from parsers.request import ParseRequest

__all__ = ["DeepSeekV3Reasoning", "build"]

#: Template switches that turn thinking on (vLLM reads both; the template reads `thinking`).
SWITCHES = ("thinking", "enable_thinking")


class DeepSeekV3Reasoning(ReasoningFamily, frozen=True):
    """R1's configuration, present only for requests that turn thinking on."""

    def bind(self, request: ParseRequest) -> ReasoningFamily | None:
        """None (no reasoning section) unless a thinking switch is true."""
        kwargs = request.chat_template_kwargs
        return self if any(bool(kwargs.get(k)) for k in SWITCHES) else None

    def reasoning_ended(self, request: ParseRequest, prompt_token_ids: Sequence[int]) -> bool:
        """True with thinking off (vLLM's identity parser), else R1's look-back."""
        if self.bind(request) is None:
            return True
        return prompt_closes_reasoning(self, prompt_token_ids)


def build(facts: TokenizerFacts) -> DeepSeekV3Reasoning:
    """DeepSeek-V3.1's reasoning configuration for this tokenizer."""
    return DeepSeekV3Reasoning(
        family="deepseek_v3",
        start_id=facts.marker_id("<think>", "deepseek_v3"),
        start_text="<think>",
        end_id=facts.marker_id("</think>", "deepseek_v3"),
        end_text="</think>",
        empty_deltas=True,
        answer_empty_deltas=False,
    )
