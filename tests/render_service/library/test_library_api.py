"""The library's public surface on the embedded default model (no ../shared needed): dicts or
Structs everywhere, a stream resumed from its state, extend and loss masks on a ChatML template."""

from __future__ import annotations

from functools import cache

import pytest

import render_service
from render_service import Renderer
from render_service.errors import RenderServiceError
from render_service.model.default_model import ensure_default_model
from render_service.protocol.chat import ChatCompletionRequest
from render_service.protocol.tokenize import DetokenizeRequest
from tests.golden import model_dir, needs_shared


@cache
def renderer() -> Renderer:
    return Renderer.from_pretrained(str(ensure_default_model()), state_secret="test-secret")


def test_public_names() -> None:
    assert set(render_service.__all__) == {
        "ChatStream",
        "Extension",
        "LossMask",
        "Renderer",
        "Settings",
        "__version__",
    }
    for name in render_service.__all__:
        assert getattr(render_service, name) is not None


def test_dicts_and_structs_give_the_same_answers() -> None:
    r = renderer()
    body = {"messages": [{"role": "user", "content": "Hello"}]}
    struct = ChatCompletionRequest(messages=body["messages"])
    assert r.render_chat(body).token_ids == r.render_chat(struct).token_ids
    assert r.tokenize(body).tokens == r.render_chat(body).token_ids
    ids = r.tokenize({"prompt": "Hello there"}).tokens
    assert r.detokenize({"tokens": ids}).prompt == "Hello there"
    assert r.detokenize(DetokenizeRequest(tokens=ids)).prompt == "Hello there"
    choice = r.derender_chat(r.render_chat(body).token_ids, ids, struct)
    assert choice.message.content == "Hello there"
    assert choice.finish_reason == "stop"


def test_derender_refuses_what_the_http_endpoint_refuses() -> None:
    with pytest.raises(RenderServiceError) as caught:
        renderer().derender_chat([1], [-1], None)
    assert caught.value.status == 400
    with pytest.raises(RenderServiceError):
        renderer().derender_chat([1], [], None)


def test_a_stream_resumes_from_its_state() -> None:
    r = renderer()
    ids = r.tokenize({"prompt": "One two three four five six"}).tokens
    whole = r.chat_stream(None, [1, 2])
    deltas = [whole.feed(ids[i : i + 2]).delta.content for i in range(0, len(ids), 2)]
    first = r.chat_stream(None, [1, 2])
    resumed_deltas = [first.feed(ids[:2]).delta.content]
    checkpoint = first.state
    assert isinstance(checkpoint, str)
    # A new renderer with the same secret (another process, say) continues the stream.
    other = Renderer.from_pretrained(str(ensure_default_model()), state_secret="test-secret")
    second = other.chat_stream(None, [1, 2], state=checkpoint)
    resumed_deltas += [second.feed(ids[i : i + 2]).delta.content for i in range(2, len(ids), 2)]
    assert resumed_deltas == deltas
    assert "".join(d or "" for d in deltas) == "One two three four five six"


def test_extend_appends_the_next_turn_verbatim() -> None:
    r = renderer()
    first = {"messages": [{"role": "user", "content": "Hi"}]}
    prompt = r.render_chat(first).token_ids
    reply = "Hello! How can I help?"
    end = r.model.info.eos_token_ids[0]
    output = [*r.tokenize({"prompt": reply}).tokens, end]
    history = {"messages": [*first["messages"], {"role": "assistant", "content": reply}]}
    new = [{"role": "user", "content": "Tell me a joke."}]
    extension = r.extend([*prompt, *output], new, history)
    assert extension.history_stable and extension.first_difference is None
    assert extension.token_ids[: len(prompt) + len(output)] == [*prompt, *output]
    assert (
        extension.token_ids == r.render_chat({"messages": [*history["messages"], *new]}).token_ids
    )
    # A reply the template would render differently is kept verbatim, and reported.
    odd = [*r.tokenize({"prompt": " " + reply}).tokens, end]
    changed = r.extend([*prompt, *odd], new, history)
    assert not changed.history_stable
    assert changed.first_difference == len(prompt)
    assert changed.token_ids[: len(prompt) + len(odd)] == [*prompt, *odd]


def test_loss_mask_marks_assistant_tokens() -> None:
    r = renderer()
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Goodbye!"},
    ]
    mask = r.loss_mask({"messages": messages})
    assert mask.history_stable
    trained = r.model.decode([t for t, m in zip(mask.token_ids, mask.trainable, strict=True) if m])
    end = r.model.decode([r.model.info.eos_token_ids[0]])
    assert trained == f"Hello!{end}Goodbye!{end}"
    assert mask.message_index[0] == 0 and mask.message_index[-1] == 4
    assert mask.boundaries[-1] == len(mask.token_ids)


@needs_shared
def test_gpt_oss_with_another_parser_family_is_a_value_error_not_an_exit() -> None:
    with pytest.raises(ValueError, match="gpt-oss output is Harmony"):
        Renderer.from_pretrained(str(model_dir("gpt-oss")), reasoning_parser="qwen3")
