"""Renders that reuse cached prompt stretches and chunks give exactly the ids of a cold render.

A conversation grows turn by turn through one renderer (its caches warm with every earlier turn,
long messages sharing their beginnings) and each turn is compared with a renderer of the same
model whose segment cache is off, for every shared model with a chat template; templates that
rewrite history (Qwen3 and DeepSeek-R1 drop earlier turns' reasoning) included.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from render_service.model.loading import load_model
from render_service.render import Renderer
from render_service.settings import Settings
from tests.golden import MODELS, needs_shared

# Every shared model rendered through a chat template (gpt-oss renders with Harmony, the
# Mistral directory with mistral_common).
TEMPLATE_MODELS = [
    "qwen3",
    "qwen3-coder",
    "qwen2.5-instruct",
    "qwen2.5-vl",
    "deepseek-r1-distill-qwen",
    "deepseek-v3.1",
    "llama-3.1-instruct",
    "glm-4.5",
    "minimax-m2.7",
    "gemma-3-it",
]

WORDS = ["report", "café", "costs", "7", "euros", "the", "Line", "naïve", "数据", "🌍", "it's"]
PHRASE = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)


@pytest.fixture(scope="module", params=TEMPLATE_MODELS)
def renderers(request: pytest.FixtureRequest) -> Any:
    if not (MODELS / request.param).is_dir():
        pytest.skip(f"../shared/models/{request.param} is not present")
    model = load_model(str(MODELS / request.param), served_model_name="m")
    warm = Renderer(model, Settings(model=str(MODELS / request.param)))
    cold = Renderer(model, Settings(model=str(MODELS / request.param), segment_cache_entries=0))
    assert warm.prompts.segments is not None and warm.prompts.segments.enabled
    yield warm, cold
    warm.close()
    cold.close()


@needs_shared
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    document=st.lists(PHRASE, min_size=30, max_size=120).map(". ".join),
    questions=st.lists(PHRASE, min_size=2, max_size=5),
    cuts=st.lists(st.floats(0.0, 1.0), min_size=5, max_size=5),
    reasoning=st.booleans(),
)
def test_each_turn_of_a_growing_conversation_renders_as_cold(
    renderers: tuple[Renderer, Renderer],
    document: str,
    questions: list[str],
    cuts: list[float],
    reasoning: bool,
) -> None:
    warm, cold = renderers
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"Know this: {document}"}]
    for turn, question in enumerate(questions):
        quoted = document[: int(len(document) * cuts[turn])]
        messages.append({"role": "user", "content": f"{quoted} {question}?"})
        request = {"model": "m", "messages": messages}
        assert warm.render_chat(request).token_ids == cold.render_chat(request).token_ids
        answer: dict[str, Any] = {"role": "assistant", "content": f"{question}. {quoted}"}
        if reasoning:
            answer["reasoning_content"] = f"{document[: len(quoted) // 2]} so"
        messages.append(answer)
