"""``Renderer.extend`` on every shared model: the conversation so far verbatim, then exactly what a
full re-render adds, wherever the template keeps history stable; where it does not, the result
says so and the break lies in the history, never in the new part.

The "generated" ids are the template's own rendering of the conversation up to its last
end-of-turn token: what a model trained on that template produces.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from render_service.library import Renderer
from tests.golden import needs_shared
from tests.render_service.library.conversations import (
    capabilities,
    conversations,
    model_dirs,
    renderer,
)

pytestmark = needs_shared

# Templates that render earlier turns differently once the conversation goes on, and why.
REWRITES_HISTORY = {
    "qwen3": "the last assistant turn gets <think> (empty or its reasoning), earlier ones lose it",
    "glm-4.5": "reasoning of turns before the last user message becomes <think></think>",
    "minimax-m2.7": "drops the reasoning of assistant turns before the last user message",
    "gpt-oss": "a final answer ends with <|return|> when generated, with <|end|> in history",
}


def generated_ids(r: Renderer, request: dict[str, Any], new: list[dict[str, Any]]) -> list[int]:
    """The conversation as a model trained on the template generates it: through its last
    end-of-turn token (the separator after it is never generated), or, where the template
    closes no turn (GLM), with the stop token that opens the next one."""
    ids = r.tokenize({**request, "add_generation_prompt": False}).tokens
    ends = set(r.model.info.eos_token_ids) | {r.model.info.eos_token_id}
    if ids[-1] not in ends:
        # The template closes no turn: the model stops with the token that follows its last
        # words in the whole conversation (found by the tagged text's last ids).
        full = r.tokenize({**request, "messages": [*request["messages"], *new]}).tokens
        tail = ids[-3:]
        at = max(i for i in range(len(full) - 2) if full[i : i + 3] == tail) + 3
        if full[at] in ends:
            return [*ids, full[at]]
    last = max(i for i, t in enumerate(ids) if t in ends)
    return ids[: last + 1]


def models() -> list[Any]:
    return [pytest.param(m, id=m) for m in model_dirs()]


def check_extension(model: str, example: dict[str, Any]) -> None:
    r = renderer(model)
    request, new = example["request"], example["new"]
    conversation = generated_ids(r, request, new)
    extension = r.extend(conversation, new, request)
    full = r.tokenize({**request, "messages": [*request["messages"], *new]}).tokens
    assert extension.token_ids[: len(conversation)] == conversation
    assert extension.token_ids == [*conversation, *extension.new_token_ids]
    if extension.history_stable:
        assert extension.token_ids == full
        assert extension.first_difference is None
        return
    assert model in REWRITES_HISTORY, (
        f"{model}: re-render differs at {extension.first_difference}: "
        f"{r.model.decode(full[extension.first_difference or 0 :][:20])!r}"
    )
    first = extension.first_difference
    assert first is not None and first < len(conversation)
    assert extension.token_ids[:first] == full[:first]
    assert extension.token_ids[first] != full[first]
    # The new part is the re-render's new part.
    assert full[-len(extension.new_token_ids) :] == extension.new_token_ids


@pytest.mark.parametrize("model", models())
def test_extend_equals_full_rerender(model: str) -> None:
    multi_turn, tools, parallel = capabilities(model)
    if not multi_turn:
        pytest.skip(f"{model}'s template cannot render a multi-turn chat")

    @settings(
        max_examples=15,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=True,
    )
    @given(conversations(tools, parallel))
    def run(example: dict[str, Any]) -> None:
        check_extension(model, example)

    run()


@pytest.mark.skipif(not (needs_shared.args and not needs_shared.args[0]), reason="needs ../shared")
def test_qwen3_reasoning_before_a_new_user_turn_is_reported() -> None:
    r = renderer("qwen3")
    request = {
        "messages": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "reasoning": "Simple sum.", "content": "4"},
        ]
    }
    new = [{"role": "user", "content": "And 3+3?"}]
    conversation = generated_ids(r, request, new)
    extension = r.extend(conversation, new, request)
    assert not extension.history_stable
    think = r.model.added_tokens()["<think>"]
    assert extension.first_difference == conversation.index(think)
    tool_turn = r.extend(
        conversation, [{"role": "tool", "tool_call_id": "c", "content": "x"}], request
    )
    assert tool_turn.history_stable
