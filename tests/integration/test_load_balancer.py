"""Three replicas behind a real nginx: round robin, one replica SIGKILLed mid-traffic, no request lost.

Every answer through the balancer must equal the answer of a single server for the same body. For
streaming derender that means 20 concurrent streams whose chunks hop between replicas (the signed
stream_state carries everything) and whose chunks equal a single-server run, chunk for chunk.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenizers import Tokenizer

from tests.integration.nginx import nginx_binary, running_nginx
from tests.integration.server import RunningServer, running_server

CHAT = "/v1/chat/completions/render"
CMPL = "/v1/completions/render"
DERENDER = "/v1/chat/completions/derender"
SECRET = "load-balancer-test-secret-0123456789"
STREAMS = 20
PARSER_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOPICS = ["foxes", "the sea", "prime numbers", "bread", "trains", "moths", "rain", "chess"]


def refuses_connections(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


class Cluster:
    def __init__(self, replicas: list[RunningServer], url: str) -> None:
        self.replicas = replicas
        self.url = url


@pytest.fixture
def cluster(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    nginx_binary()  # skip before starting servers when nginx is missing
    env = {"RENDER_SERVICE_STATE_SECRET": SECRET}
    managers = [
        running_server(
            [str(default_model_dir), *PARSER_FLAGS], tmp_path_factory.mktemp(f"replica{i}"), env=env
        )
        for i in range(3)
    ]
    with ExitStack() as stack:
        # Start the replicas side by side: each spends seconds loading the model.
        with ThreadPoolExecutor(len(managers)) as pool:
            starts = [pool.submit(manager.__enter__) for manager in managers]
        replicas = []
        for manager, start in zip(managers, starts, strict=True):
            if start.exception() is None:
                stack.push(manager.__exit__)
                replicas.append(start.result())
        for start in starts:
            start.result()  # re-raise a failed start, after the started ones are in the stack
        url = stack.enter_context(
            running_nginx([r.port for r in replicas], tmp_path_factory.mktemp("nginx"))
        )
        yield Cluster(replicas, url)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))


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


# ---- streaming derender -------------------------------------------------------------------------


class Stream:
    """One chat: its request, the model output the engine would send, and how it is chunked."""

    def __init__(self, index: int, tokenizer: Tokenizer) -> None:
        topic = TOPICS[index % len(TOPICS)]
        self.request_id = f"stream-{index}"
        self.chat = {
            "messages": [
                {"role": "user", "content": f"Weather and a fact about {topic}? ({index})"}
            ],
            "tools": [WEATHER],
        }
        call = '<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{}"}}}}\n</tool_call>'
        kind = index % 4
        if kind == 0:
            text = f"Here is fact {index} about {topic}: it is older than it looks."
        elif kind == 1:
            text = f"Let me check the weather for {topic}.\n" + call.format(f"Paris-{index}")
        elif kind == 2:
            text = call.format("Oslo") + "\n" + call.format(f"Lima {index}")
        else:
            text = f"Café ☕ n°{index} — 你好, {topic}! Ünïcödé splits across chunks."
        self.output_ids = tokenizer.encode(text + "<|im_end|>", add_special_tokens=False).ids
        sizes = [1 + (index + k) % 3 for k in range(len(self.output_ids))]
        self.chunks: list[list[int]] = []
        start = 0
        for size in sizes:
            if start >= len(self.output_ids):
                break
            self.chunks.append(self.output_ids[start : start + size])
            start += size


class ResendingClient:
    """Sends a call again when its response was cut off after it began. A SIGKILL'd replica can
    die between writing a response's headers and its body; nginx cannot retry once the headers
    have gone to the client, so a client does (every endpoint is a pure function of its body)."""

    def __init__(self, client: httpx.Client) -> None:
        self._client = client
        self.resent = 0

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._client.post(url, **kwargs)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            self.resent += 1
            return self._client.post(url, **kwargs)


def run_stream(
    client: httpx.Client | ResendingClient, stream: Stream
) -> tuple[list[Any], list[str], dict[str, Any]]:
    """Render, then derender chunk by chunk carrying stream_state (lean after the first chunk).

    Returns the chunks (without the wall-clock ``created``), which replica served each call, and
    the batch derender of the whole output (an independent oracle for what the chunks add up to).
    """
    headers = {"X-Request-Id": stream.request_id}
    rendered = client.post(CHAT, json=stream.chat, headers=headers)
    assert rendered.status_code == 200, rendered.text
    generate = rendered.json()
    served = [rendered.headers.get("x-served-by", "direct")]
    state = None
    chunks = []
    for k, ids in enumerate(stream.chunks):
        last = k == len(stream.chunks) - 1
        body: dict[str, Any] = {
            "stream": True,
            "generate_chunk": {
                "request_id": generate["request_id"],
                "choices": [
                    {"index": 0, "token_ids": ids, "finish_reason": "stop" if last else None}
                ],
            },
            "stream_state": state,
        }
        if state is None:
            body["chat_request"] = stream.chat
            body["prompt_token_ids"] = generate["token_ids"]
        response = client.post(DERENDER, json=body)
        assert response.status_code == 200, response.text
        served.append(response.headers.get("x-served-by", "direct"))
        answer = response.json()
        state = answer["stream_state"]
        answer["chunk"].pop("created")
        chunks.append(answer["chunk"])
    batch = client.post(
        DERENDER,
        json={
            "generate_response": {
                "request_id": generate["request_id"],
                "choices": [{"index": 0, "token_ids": stream.output_ids, "finish_reason": "stop"}],
            },
            "chat_request": stream.chat,
            "prompt_token_ids": generate["token_ids"],
        },
    )
    assert batch.status_code == 200, batch.text
    return chunks, served, batch.json()["choices"][0]


def assemble(chunks: list[Any]) -> dict[str, Any]:
    """Join streamed deltas into a message: content, and each tool call's id, name and arguments."""
    content = ""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.get("id") or ""
                function = call.get("function") or {}
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)], "finish": finish}


def batch_message(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice["message"]
    calls = [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message.get("tool_calls") or []
    ]
    return {
        "content": message["content"] or "",
        "tool_calls": calls,
        "finish": choice["finish_reason"],
    }


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_twenty_concurrent_derender_streams_survive_a_stopped_replica(
    cluster: Cluster, tokenizer: Tokenizer, stop: signal.Signals
) -> None:
    """SIGKILL: nginx retries what the dead replica dropped before answering, the client what it
    cut off mid-response. SIGTERM: the replica finishes what it holds, refuses the rest (retried
    elsewhere) and exits 0."""
    streams = [Stream(i, tokenizer) for i in range(STREAMS)]
    with cluster.replicas[0].client() as direct:
        expected = [run_stream(direct, stream) for stream in streams]
    for chunks, _, batch in expected:  # the single-server run itself agrees with batch derender
        assert assemble(chunks) == batch_message(batch)
    victim = cluster.replicas[2]
    survivors = cluster.replicas[:2]
    before = [counter(r, "render_service_derender_chunks_total") for r in survivors]

    total = sum(len(s.chunks) + 2 for s in streams)
    done = 0
    lock = threading.Lock()
    killed, stopped = threading.Event(), threading.Event()

    def tracked(stream: Stream) -> tuple[list[Any], list[str], dict[str, Any]]:
        def count(response: httpx.Response) -> None:
            nonlocal done
            with lock:
                done += 1
                kill = done >= total // 3 and not killed.is_set()
                if kill:
                    os.kill(victim.process.pid, stop)
                    killed.set()
            if kill:
                # A SIGTERM'd replica serves on until its loop notices (up to 0.1 s): hold the
                # streams until it refuses connections, so the rest of them meet a stopped one.
                for _ in range(200):
                    if refuses_connections(victim.port):
                        break
                    time.sleep(0.05)
                stopped.set()
            elif killed.is_set():
                stopped.wait(15)

        with httpx.Client(
            base_url=cluster.url, timeout=60, event_hooks={"response": [count]}
        ) as client:
            if stop == signal.SIGTERM:  # a graceful stop cuts nothing off: no second tries
                return run_stream(client, stream)
            resending = ResendingClient(client)
            try:
                return run_stream(resending, stream)
            finally:
                with lock:
                    resent.append(resending.resent)

    resent: list[int] = []
    with ThreadPoolExecutor(STREAMS) as pool:
        results = list(pool.map(tracked, streams))
    # Only calls in flight on the killed replica can have been cut off: one per stream at most.
    assert all(n <= 1 for n in resent), resent

    assert killed.is_set()
    status = victim.process.wait(timeout=60)
    assert status == (0 if stop == signal.SIGTERM else -signal.SIGKILL)
    for stream, (chunks, _, _), (want, _, _) in zip(streams, results, expected, strict=True):
        assert chunks == want, stream.request_id
    # Consecutive calls of a stream hopped between replicas. Round robin over streams held in
    # lockstep can give one stream the same replica every time, so not every stream must hop.
    hopped = [len({s.split(", ")[-1] for s in served}) >= 2 for _, served, _ in results]
    assert sum(hopped) >= STREAMS // 2, hopped
    victim_addr = f"127.0.0.1:{victim.port}"
    assert any(f"{victim_addr}, " in s for _, served, _ in results for s in served)
    after = [counter(r, "render_service_derender_chunks_total") for r in survivors]
    assert all(a > b for a, b in zip(after, before, strict=True))
    cache = sum(
        counter(r, "render_service_parser_cache_events_total", event=e)
        for r in survivors
        for e in ("hit", "miss")
    )
    assert cache > 0
