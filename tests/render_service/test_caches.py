"""Every per-process cache is bounded by bytes, its budget a flag and its size on /metrics
(issue 14, class 10).

Regression: the prompt-segment cache kept up to 4,096 stretches whatever their length, each
with its ids as a list of Python ints (a 32k-token stretch is over 1 MB), so a 2-worker server
fed distinct long chats grew to 5.9 GB; the parser, template and logprob-text caches were
bounded by count only. Runs on the embedded default model (no ../shared).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from tokenizers import Tokenizer

from parsers import ParseRequest
from render_service import Renderer
from render_service.caches import ByteLRU
from render_service.derender.logprobs import TokenTexts
from render_service.derender.parser_cache import ParserCache
from render_service.http.app import build_app
from render_service.model import templating
from render_service.model.default_model import ensure_default_model
from render_service.model.tokenizing import SegmentEncoder, stretch_bytes

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model(tmp_path_factory.mktemp("caches-model"))


def distinct_text(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" {seed}"


def test_byte_lru_keeps_its_budget_and_drops_oversized_entries() -> None:
    cache: ByteLRU[int, str] = ByteLRU("test", 1000)
    for i in range(100):
        cache.put(i, "x", 100)
        assert cache.size().bytes <= 1000
    assert len(cache) == 10
    assert cache.get(99) == "x" and cache.get(0) is None
    cache.put(1000, "big", 1001)
    assert cache.get(1000) is None
    cache.resize(300)
    assert cache.size().bytes <= 300


def test_segment_cache_is_bounded_by_bytes_and_shares_its_ints(model_dir: Path) -> None:
    backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    budget = 200_000
    encoder = SegmentEncoder(backend, 100_000, max_bytes=budget, fast=False)
    assert encoder.enabled
    for seed in range(60):
        text = "<|im_start|>user\n" + distinct_text(seed, 2000) + "<|im_end|>"
        assert encoder.encode(text) == backend.encode(text, add_special_tokens=False).ids
        assert encoder.bytes <= budget
    assert 0 < len(encoder) < 60  # long stretches were evicted by bytes, not by count
    sizes = [entry[0] for entry in encoder._cache.values()]
    assert sum(sizes) == encoder.bytes
    piece, (size, ids) = next(iter(encoder._cache.items()))
    assert isinstance(ids, list) and all(i is encoder._ints[i] for i in ids)
    assert size == stretch_bytes(piece, ids)


def test_parser_state_cache_is_bounded_by_bytes() -> None:
    cache: ParserCache[str] = ParserCache(10_000, 60.0, max_bytes=10_000)
    for i in range(1000):
        cache.check_in(i.to_bytes(16, "little"), "state", 1500)
        assert cache.stats().bytes <= 10_000
    assert cache.stats().size == 6
    assert cache.check_out((999).to_bytes(16, "little")) == "state"
    assert cache.stats().bytes == 5 * 1500


def test_logprob_texts_are_bounded_by_bytes(model_dir: Path) -> None:
    backend = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    texts = TokenTexts.for_tokenizer(backend, cache_bytes=50_000)
    for token in range(5000):
        assert texts([token]) == backend.decode([token], skip_special_tokens=False)
        assert texts.cache.size().bytes <= 50_000
    assert 0 < len(texts.cache) < 5000


def test_parsers_per_tool_set_are_bounded_by_bytes(model_dir: Path) -> None:
    renderer = Renderer.from_pretrained(
        str(model_dir),
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        small_cache_bytes=200_000,
    )
    parsing = renderer.parsing
    assert parsing is not None
    for i in range(200):
        tool = {
            "type": "function",
            "function": {"name": f"tool_{i}", "description": "d" * 500, "parameters": {}},
        }
        parsing.parser(ParseRequest(tools=[tool]))
        assert parsing.parsers.size().bytes <= 200_000
    assert 0 < len(parsing.parsers) < 200


def test_template_facts_are_cached_by_digest_within_the_budget() -> None:
    templating.TEMPLATE_FACTS.resize(20_000)
    try:
        for i in range(500):
            template = "{% for m in messages %}{{ m.content }}{% endfor %}" + "x" * 1000 + str(i)
            assert templating.detect_content_format(template) == "string"
            assert templating.TEMPLATE_FACTS.size().bytes <= 20_000
        assert all(len(key) == 16 for key in templating.TEMPLATE_FACTS._entries)
    finally:
        templating.TEMPLATE_FACTS.resize(16 * 1024 * 1024)


def test_every_cache_has_its_size_on_metrics(model_dir: Path) -> None:
    renderer = Renderer.from_pretrained(
        str(model_dir), enable_auto_tool_choice=True, tool_call_parser="hermes"
    )
    client = TestClient(build_app(renderer))
    chat = {"messages": [{"role": "user", "content": distinct_text(1, 100)}]}
    assert client.post("/v1/chat/completions/render", json=chat).status_code == 200
    body = client.get("/metrics").text
    names = (
        "segments",
        "templates",
        "compiled_templates",
        "tool_blocks",
        "parsers",
        "stream_states",
    )
    for name in (*names, "token_texts"):
        assert f'render_service_cache_bytes{{cache="{name}"}}' in body, name
        assert f'render_service_cache_entries{{cache="{name}"}}' in body, name
    line = next(
        line
        for line in body.splitlines()
        if line.startswith('render_service_cache_bytes{cache="segments"}')
    )
    assert float(line.split()[-1]) > 0
