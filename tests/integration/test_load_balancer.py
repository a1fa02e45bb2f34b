"""Three replicas behind a real nginx: round robin, one replica SIGKILLed mid-traffic, no request lost.

Every answer through the balancer must equal the answer of a single server for the same body.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.nginx import nginx_binary, running_nginx
from tests.integration.server import RunningServer, running_server

CHAT = "/v1/chat/completions/render"
CMPL = "/v1/completions/render"
SECRET = "load-balancer-test-secret"
TOPICS = ["foxes", "the sea", "prime numbers", "bread", "trains", "moths", "rain", "chess"]


class Cluster:
    def __init__(self, replicas: list[RunningServer], url: str) -> None:
        self.replicas = replicas
        self.url = url


@pytest.fixture(scope="module")
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    nginx_binary()  # skip before starting servers when nginx is missing
    env = {"RENDER_SERVICE_STATE_SECRET": SECRET}
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(
                running_server(
                    [str(default_model_dir)], tmp_path_factory.mktemp(f"replica{i}"), env=env
                )
            )
            for i in range(3)
        ]
        url = stack.enter_context(
            running_nginx([r.port for r in replicas], tmp_path_factory.mktemp("nginx"))
        )
        yield Cluster(replicas, url)


def requests(count: int) -> list[tuple[str, dict[str, Any], str]]:
    """(path, body, request id): chats of growing length and multi-prompt completions."""
    out = []
    for i in range(count):
        topic = TOPICS[i % len(TOPICS)]
        if i % 3 == 2:
            body: dict[str, Any] = {"prompt": [f"Facts about {topic}:", f"{i} reasons"]}
            out.append((CMPL, body, f"lb-{i}"))
        else:
            turns = [
                {"role": "user", "content": f"Tell me about {topic}. " * (1 + i % 7)},
                {"role": "assistant", "content": f"{topic.capitalize()} are interesting."},
                {"role": "user", "content": f"More, part {i}."},
            ]
            out.append((CHAT, {"messages": turns, "max_tokens": 16 + i}, f"lb-{i}"))
    return out


def post(client: httpx.Client, path: str, body: dict[str, Any], request_id: str) -> httpx.Response:
    return client.post(path, json=body, headers={"X-Request-Id": request_id})


def counter(server: RunningServer, name: str, **labels: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_round_robin_spreads_consecutive_requests(cluster: Cluster) -> None:
    served_by = []
    with httpx.Client(base_url=cluster.url, timeout=60) as client:
        for path, body, request_id in requests(9):
            response = post(client, path, body, request_id)
            assert response.status_code == 200
            assert response.headers["x-request-id"] == request_id
            served_by.append(response.headers["x-served-by"])
    assert all(a != b for a, b in itertools.pairwise(served_by)), served_by
    assert len(set(served_by)) == 3


def test_killing_a_replica_mid_traffic_loses_no_request(cluster: Cluster) -> None:
    batch = requests(150)
    with cluster.replicas[0].client() as direct:
        expected = [post(direct, p, b, r).json() for p, b, r in batch]
    before = [counter(r, "render_service_requests_total", status="200") for r in cluster.replicas]

    victim = cluster.replicas[2]
    done = 0
    lock = threading.Lock()
    killed = threading.Event()

    def send(item: tuple[str, dict[str, Any], str]) -> tuple[int, Any, str]:
        nonlocal done
        response = post(client, *item)
        with lock:
            done += 1
            if done == len(batch) // 3 and not killed.is_set():
                os.kill(victim.process.pid, signal.SIGKILL)
                killed.set()
        return response.status_code, response.json(), response.headers["x-served-by"]

    with (
        httpx.Client(base_url=cluster.url, timeout=60) as client,
        ThreadPoolExecutor(8) as pool,
    ):
        results = list(pool.map(send, batch))

    assert killed.is_set()
    victim.process.wait(timeout=10)
    assert [status for status, _, _ in results] == [200] * len(batch)
    assert [body for _, body, _ in results] == expected
    # nginx tried the dead replica and moved on ("victim, survivor" in $upstream_addr).
    victim_addr = f"127.0.0.1:{victim.port}"
    assert any(f"{victim_addr}, " in served for _, _, served in results)
    survivors = cluster.replicas[:2]
    after = [counter(r, "render_service_requests_total", status="200") for r in survivors]
    # Both survivors took traffic; together they answered everything the victim did not.
    assert all(a > b for a, b in zip(after, before, strict=False))
    rendered = counter(survivors[0], "render_service_rendered_tokens_total")
    assert rendered > 0
