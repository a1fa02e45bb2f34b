"""``Renderer.loss_mask`` on every shared model: each message's boundary is where re-rendering the
conversation up to it ends, and the trainable tokens are exactly each assistant message's
generated text through its end-of-turn token.

Where the template rewrites earlier turns (``REWRITES_HISTORY`` in test_extend.py) a prefix does
not render as a prefix of the whole; the mask says so and still marks every assistant message.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from render_service.errors import InvalidRequest
from render_service.library import Renderer
from tests.golden import needs_shared
from tests.render_service.library.conversations import (
    capabilities,
    conversations,
    model_dirs,
    renderer,
)
from tests.render_service.library.test_extend import REWRITES_HISTORY

pytestmark = needs_shared


def prefix_ids(
    r: Renderer, request: dict[str, Any], n: int, generation_prompt: bool
) -> list[int] | None:
    """The first ``n`` messages rendered; None where the template refuses them alone."""
    messages = request["messages"][:n]
    try:
        return r.tokenize(
            {**request, "messages": messages, "add_generation_prompt": generation_prompt}
        ).tokens
    except InvalidRequest:
        return None


def check_mask(model: str, request: dict[str, Any]) -> None:
    r = renderer(model)
    mask = r.loss_mask(request)
    messages = request["messages"]
    ids = mask.token_ids
    assert ids == r.tokenize({**request, "add_generation_prompt": False}).tokens
    assert len(mask.message_index) == len(ids) == len(mask.trainable)
    assert len(mask.boundaries) == len(messages)
    assert mask.message_index == sorted(mask.message_index)
    assert mask.boundaries[-1] == len(ids)
    if not mask.history_stable:
        assert model in REWRITES_HISTORY
    ends = set(r.model.info.eos_token_ids) | {r.model.info.eos_token_id}
    start = 0
    for k, message in enumerate(messages):
        end = mask.boundaries[k]
        if mask.history_stable and k < len(messages) - 1:
            # The boundary is exactly where the conversation up to this message ends, or where
            # that rendering departs from the whole (a turn the next message continues).
            prefix = prefix_ids(r, request, k + 1, False)
            if prefix is None:  # the template refuses it alone: rendered in the next span
                assert end == start
            else:
                assert ids[:end] == prefix[:end]
                assert end == len(prefix) or (
                    prefix[end] != ids[end] and message["role"] != "assistant"
                )
        span = [i for i in range(len(ids)) if mask.message_index[i] == k]
        assert span == list(range(start, end))
        trained = [i for i in span if mask.trainable[i]]
        text = message.get("content") or ""
        if message["role"] != "assistant":
            assert not trained
            if text and text not in r.model.decode(ids[start:end]):
                # A template that folds the system prompt into the first user turn (Gemma 3)
                # or refuses it alone (Llama 3.1 with tools): its text is in the next span.
                assert k == 0 and message["role"] == "system"
                assert text in r.model.decode(ids[end : mask.boundaries[1]])
        else:
            assert trained == list(range(trained[0], trained[-1] + 1))
            if mask.history_stable:
                # Everything after the generation prompt (as far as the whole has it: a prompt
                # that opens reasoning departs where the text begins), through the turn's end.
                prompt = prefix_ids(r, request, k, True)
                assert prompt is not None
                assert ids[: trained[0]] == prompt[: trained[0]]
                assert trained[0] == len(prompt) or ids[trained[0]] != prompt[trained[0]]
            if ids[trained[-1]] not in ends:
                # The conversation's last token, GLM's (which closes no turn), or a turn end
                # the history rewrote as another special token (gpt-oss's <|end|>).
                rewritten = not mask.history_stable and ids[trained[-1]] in r.model.special_ids()
                assert trained[-1] == len(ids) - 1 or model == "glm-4.5" or rewritten
            assert text in r.model.decode([ids[i] for i in trained])
        start = end


@pytest.mark.parametrize("model", [pytest.param(m, id=m) for m in model_dirs()])
def test_loss_mask_boundaries_are_prefix_renders(model: str) -> None:
    multi_turn, tools, parallel = capabilities(model)
    if not multi_turn:
        pytest.skip(f"{model}'s template cannot render a multi-turn chat")

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=True,
    )
    @given(conversations(tools, parallel))
    def run(example: dict[str, Any]) -> None:
        check_mask(model, example["request"])

    run()
