"""Renderer as a library: every method takes the plain dict its HTTP endpoint takes, as
``render_chat`` does, and answers as it answers the typed body. Runs on the embedded default
model (no ../shared)."""

from __future__ import annotations

from pathlib import Path

import pytest

from render_service import Renderer
from render_service.errors import SchemaError
from render_service.model.default_model import ensure_default_model
from render_service.protocol.tokenize import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)

CHAT = {"messages": [{"role": "user", "content": "Hello!"}]}


@pytest.fixture(scope="module")
def renderer(tmp_path_factory: pytest.TempPathFactory) -> Renderer:
    model = ensure_default_model(Path(tmp_path_factory.mktemp("library-model")))
    return Renderer.from_pretrained(str(model))


def test_tokenize_takes_a_chat_dict_like_render_chat(renderer: Renderer) -> None:
    typed = renderer.tokenize(TokenizeChatRequest(messages=CHAT["messages"]))
    plain = renderer.tokenize({**CHAT, "return_token_strs": True})
    assert plain.tokens == typed.tokens == renderer.render_chat(CHAT).token_ids
    assert plain.token_strs is not None and len(plain.token_strs) == plain.count


def test_tokenize_takes_a_prompt_dict(renderer: Renderer) -> None:
    typed = renderer.tokenize(TokenizeCompletionRequest(prompt="Hello, world"))
    plain = renderer.tokenize({"prompt": "Hello, world"})
    assert plain.tokens == typed.tokens and plain.count == 3


def test_detokenize_takes_a_dict(renderer: Renderer) -> None:
    ids = renderer.tokenize({"prompt": "Hello, world"}).tokens
    assert renderer.detokenize({"tokens": ids}).prompt == "Hello, world"
    assert renderer.detokenize(DetokenizeRequest(tokens=ids)).prompt == "Hello, world"


@pytest.mark.parametrize(
    "call",
    [
        lambda r: r.tokenize({"prompt": 42}),
        lambda r: r.tokenize({"messages": "not a list"}),
        lambda r: r.detokenize({"tokens": ["a"]}),
    ],
)
def test_a_malformed_dict_is_the_endpoints_schema_error(renderer: Renderer, call: object) -> None:
    with pytest.raises(SchemaError):
        call(renderer)  # type: ignore[operator]
