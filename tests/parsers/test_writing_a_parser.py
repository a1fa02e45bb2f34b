"""Runs the example of docs/writing-a-parser.md against the real API."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from parsers import ChatParser, ParseRequest, TokenizerFacts
from tests.parsers import _golden as g

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "mini_think.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mini_think", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_family_parses() -> None:
    facts = TokenizerFacts.from_added_tokens({"<reasoning>": 10, "</reasoning>": 11})
    config = _load().build(facts)
    parser = ChatParser.build(config, None, ParseRequest())
    state = parser.start([1, 2, 3])
    state, first = parser.feed(state, [10, 500, 501], "<reasoning>Let me see")
    state, second = parser.feed(state, [11, 502], "</reasoning>Yes.")
    state, last = parser.finish(state)
    msg = g.accumulate(first + second + last)
    assert (msg.reasoning, msg.content) == ("Let me see", "Yes.")
