"""/metrics counters, request ids, JSON access logs and readiness, in process (starlette TestClient)."""

from __future__ import annotations

import io
import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from render_service.http import lifecycle, metrics
from render_service.http.app import build_app
from render_service.model.default_model import ensure_default_model
from render_service.render import Renderer

CHAT = "/v1/chat/completions/render"
CMPL = "/v1/completions/render"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    model = ensure_default_model(tmp_path_factory.mktemp("cache"))
    app = build_app(Renderer.from_pretrained(str(Path(model))))
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def fresh_drain_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Readiness is process state; give each test that flips it its own flag."""
    monkeypatch.setattr(lifecycle, "_draining", threading.Event())


def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_request_counts_latency_and_rendered_tokens_move(client: TestClient) -> None:
    before = scrape(client)
    prompt_ids = 0
    for text in ["Hi", "How are you today?", "Tell me a story about a fox."]:
        response = client.post(CHAT, json={"messages": [{"role": "user", "content": text}]})
        assert response.status_code == 200
        prompt_ids += len(response.json()["token_ids"])
    response = client.post(CMPL, json={"prompt": ["one", "two three"]})
    assert response.status_code == 200
    prompt_ids += sum(len(item["token_ids"]) for item in response.json())
    assert client.post(CHAT, json={"messages": []}).status_code == 400
    assert client.get("/no/such/path").status_code == 404
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    chat_ok = {"endpoint": CHAT, "method": "POST", "status": "200"}
    assert delta("render_service_requests_total", **chat_ok) == 3
    assert delta("render_service_requests_total", endpoint=CHAT, method="POST", status="400") == 1
    assert delta("render_service_requests_total", endpoint=CMPL, method="POST", status="200") == 1
    assert (
        delta("render_service_requests_total", endpoint="unmatched", method="GET", status="404")
        == 1
    )
    assert delta("render_service_request_duration_seconds_count", endpoint=CHAT) == 4
    assert delta("render_service_request_duration_seconds_bucket", endpoint=CHAT, le="+Inf") == 4
    assert delta("render_service_rendered_tokens_total") == prompt_ids
    assert value(after, "render_service_worker_pool_size") >= 1
    assert value(after, "render_service_worker_pool_queued") == 0
    assert value(after, "render_service_worker_pool_busy") == 0


def test_hooks_for_derender_and_parser_cache(client: TestClient) -> None:
    before = scrape(client)
    metrics.derender_chunk(tokens=3)
    metrics.derender_chunk()
    for event in ("hit", "hit", "miss", "eviction"):
        metrics.cache_event(event)  # type: ignore[arg-type]
    metrics.mm_items("image", 2)
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("render_service_derender_chunks_total") == 2
    assert delta("render_service_derendered_tokens_total") == 3
    assert delta("render_service_parser_cache_events_total", event="hit") == 2
    assert delta("render_service_parser_cache_events_total", event="miss") == 1
    assert delta("render_service_parser_cache_events_total", event="eviction") == 1
    assert delta("render_service_mm_items_total", modality="image") == 2


def test_pool_gauges_track_queued_and_busy() -> None:
    seen: list[tuple[float, float]] = []

    def task() -> int:
        seen.append((_gauge("queued"), _gauge("busy")))
        return 7

    queued = _gauge("queued")
    busy = _gauge("busy")
    wrapped = metrics.in_pool(task)
    assert _gauge("queued") == queued + 1
    assert wrapped() == 7
    assert seen == [(queued, busy + 1)]
    assert (_gauge("queued"), _gauge("busy")) == (queued, busy)


def test_request_id_is_echoed_or_minted(client: TestClient) -> None:
    sent = client.post(
        CHAT, json={"messages": [{"role": "user", "content": "x"}]}, headers={"X-Request-Id": "r-1"}
    )
    assert sent.headers["x-request-id"] == "r-1"
    assert sent.json()["request_id"] == "chatcmpl-r-1"
    minted = client.get("/v1/models")
    assert len(minted.headers["x-request-id"]) == 16
    int(minted.headers["x-request-id"], 16)
    errored = client.post(CHAT, json={"messages": []}, headers={"X-Request-Id": "r-2"})
    assert errored.headers["x-request-id"] == "r-2"


@pytest.fixture
def access_lines() -> Iterator[io.StringIO]:
    sink = io.StringIO()
    metrics.access_log.configure(sink)
    try:
        yield sink
    finally:
        metrics.access_log.configure(None)


def test_access_log_is_one_json_object_per_request(
    client: TestClient, access_lines: io.StringIO
) -> None:
    body = {"messages": [{"role": "user", "content": "secret prompt text"}]}
    response = client.post(CHAT, json=body, headers={"X-Request-Id": "log-1"})
    client.get("/health")  # probes are logged only with probes=True (--log-level debug)
    client.request("BREW", "/v1/models")
    lines = access_lines.getvalue().splitlines()
    assert len(lines) == 2
    record = json.loads(lines[0])
    assert record["request_id"] == "log-1"
    assert record["method"] == "POST"
    assert record["path"] == CHAT
    assert record["status"] == 200
    assert record["bytes_out"] == len(response.content)
    assert record["bytes_in"] == len(response.request.content)
    assert record["duration_ms"] >= 0
    assert "secret" not in lines[0]
    assert json.loads(lines[1])["method"] == "other"  # unknown methods cannot grow the labels


@pytest.mark.usefixtures("fresh_drain_flag")
def test_ready_turns_503_when_draining_and_health_stays_200(client: TestClient) -> None:
    assert client.get("/ready").status_code == 200
    lifecycle.begin_drain()
    assert client.get("/ready").status_code == 503
    assert client.get("/health").status_code == 200


@pytest.mark.usefixtures("fresh_drain_flag")
def test_drain_hook_runs_before_the_previous_signal_handler() -> None:
    calls: list[tuple[int, bool]] = []

    def previous(signum: int, frame: FrameType | None) -> None:
        calls.append((signum, lifecycle.draining()))

    saved = {sig: signal.getsignal(sig) for sig in lifecycle.DRAIN_SIGNALS}
    try:
        for sig in lifecycle.DRAIN_SIGNALS:
            signal.signal(sig, previous)
        assert lifecycle.chain_drain_signal()
        signal.raise_signal(signal.SIGTERM)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert calls == [(signal.SIGTERM, True)]


def test_drain_hook_does_nothing_off_the_main_thread() -> None:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(lifecycle.chain_drain_signal()))
    thread.start()
    thread.join()
    assert result == [False]


def _gauge(name: str) -> float:
    sample = metrics._registry.get_sample_value(f"render_service_worker_pool_{name}")
    assert sample is not None
    return sample


class FakeCache:
    """Stands in for ParserCache: only cumulative stats() matter to the metrics."""

    def __init__(self) -> None:
        self.counts = {"hits": 0, "misses": 0, "evictions": 0, "expirations": 0, "size": 0}

    def stats(self) -> SimpleNamespace:
        return SimpleNamespace(**self.counts)


def test_observe_derender_counts_chunks_tokens_and_cache_deltas(client: TestClient) -> None:
    stream = SimpleNamespace(
        generate_chunk=SimpleNamespace(choices=[SimpleNamespace(token_ids=[1, 2, 3])])
    )
    batch = SimpleNamespace(
        generate_responses=[
            SimpleNamespace(
                choices=[SimpleNamespace(token_ids=[4, 5]), SimpleNamespace(token_ids=None)]
            ),
            SimpleNamespace(choices=[SimpleNamespace(token_ids=[6])]),
        ]
    )
    one, other = FakeCache(), FakeCache()
    before = scrape(client)
    one.counts.update(hits=2, misses=1, size=1)
    metrics.observe_derender(stream, one)
    one.counts.update(hits=3, evictions=1, expirations=2, size=0)
    metrics.observe_derender(batch, one)
    other.counts.update(hits=1)  # a second cache (another app in this process) adds its own
    metrics.observe_derender(stream, other)
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("render_service_derender_chunks_total") == 3
    assert delta("render_service_derendered_tokens_total") == 3 + 3 + 3
    assert delta("render_service_parser_cache_events_total", event="hit") == 4
    assert delta("render_service_parser_cache_events_total", event="miss") == 1
    assert delta("render_service_parser_cache_events_total", event="eviction") == 1
    assert delta("render_service_parser_cache_events_total", event="expiration") == 2
