"""Helpers of the chat-template equality tests: a shared model's template, and a call's outcome."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from render_service.model.loading import _load_chat_template, read_json
from tests.golden import MODELS


@functools.cache
def shared_template(name: str) -> str:
    """The chat template of ``../shared/models/<name>``."""
    path = MODELS / name
    template = _load_chat_template(path, read_json(path / "tokenizer_config.json"))
    assert template is not None
    return template


def outcome(call: Callable[[], Any]) -> tuple[str, str]:
    """("text", what ``call`` returned) or ("error", what it raised): two renderers must agree
    on either."""
    try:
        return ("text", str(call()))
    except Exception as e:  # whatever one raises, the other must raise alike
        return ("error", f"{type(e).__name__}: {e}")
