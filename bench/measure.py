"""The bounded workloads, run against one base URL at a time.

Each function returns numbers plus an `Outcome`. A 404/405/501 answer means the system has no
such endpoint (yet); anything else that is not a 200 is an error worth showing in the report.
Server CPU is the difference of /proc readings taken around the measured requests.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec

from bench import loadgen
from bench.results import ERROR, NOT_IMPLEMENTED, SKIPPED, Outcome

JSON = {"content-type": "application/json"}
CHAT_RENDER = "/v1/chat/completions/render"
CHAT_DERENDER = "/v1/chat/completions/derender"
CHAT_DERENDER_STREAMS = "/v1/chat/completions/derender/streams"
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}
_NOT_THERE = {404, 405, 501}
_encode = msgspec.json.encode

CpuReader = Callable[[], float]


class Failure(Exception):
    """A request did not get a 200; carries the Outcome the report row should show."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.note)
        self.outcome = outcome


def outcome_of(response: loadgen.Reply, what: str) -> Outcome:
    return _outcome(response.status_code, response.text, what)


def _outcome(status_code: int, text: str, what: str) -> Outcome:
    if status_code == 200:
        return Outcome()
    detail = text[:160].replace("\n", " ")
    status = NOT_IMPLEMENTED if status_code in _NOT_THERE else ERROR
    return Outcome(status, f"{what}: HTTP {status_code} {detail}")


def post(client: loadgen.Client, path: str, body: bytes, what: str) -> loadgen.Reply:
    try:
        response = client.post(path, content=body, headers=JSON)
    except loadgen.ClientError as exc:
        raise Failure(Outcome(ERROR, f"{what}: {type(exc).__name__} {exc}"[:200])) from exc
    if response.status_code != 200:
        raise Failure(outcome_of(response, what))
    return response


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); with few samples p99 is the slowest one."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100.0 * len(ordered))))
    return ordered[rank - 1]


class Rendered(msgspec.Struct):
    """The one field of a render response the bench reads."""

    token_ids: list[int]


class Timing(msgspec.Struct):
    samples_ms: list[float]
    server_cpu_s: float

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)


# Each call gives the next request body (a fresh one, or always the same).
Bodies = Callable[[], bytes]


def same_body(body: bytes) -> Bodies:
    return lambda: body


def time_requests(
    client: loadgen.Client,
    cpu: CpuReader,
    path: str,
    bodies: Bodies,
    reps: int,
    warmup: int,
    what: str,
) -> Timing:
    """Sequential requests from one client; wall time per request and server CPU for all.

    The bodies are built before the clock starts.
    """
    prepared = [bodies() for _ in range(warmup + reps)]
    for body in prepared[:warmup]:
        post(client, path, body, what)
    samples = []
    cpu0 = cpu()
    for body in prepared[warmup:]:
        t0 = time.perf_counter()
        post(client, path, body, what)
        samples.append((time.perf_counter() - t0) * 1000.0)
    return Timing(samples, cpu() - cpu0)


class Throughput(msgspec.Struct):
    requests: int
    seconds: float
    server_cpu_s: float
    client_cpu_s: float


def throughput(
    base_url: str,
    cpu: CpuReader,
    path: str,
    bodies: Bodies,
    clients: int,
    seconds: float,
    max_requests: int,
) -> Throughput:
    """`clients` concurrent loops posting the same body until the time or request bound."""
    try:
        return asyncio.run(_throughput(base_url, cpu, path, bodies, clients, seconds, max_requests))
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        raise Failure(Outcome(ERROR, f"render: {type(exc).__name__} {exc}"[:200])) from exc


async def _throughput(
    base_url: str,
    cpu: CpuReader,
    path: str,
    bodies: Bodies,
    clients: int,
    seconds: float,
    max_requests: int,
) -> Throughput:
    connections = [await loadgen.Connection.open(base_url) for _ in range(clients)]
    done = 0
    failure: Outcome | None = None

    def next_request() -> bytes:
        return loadgen.post_request(base_url, path, bodies())

    try:
        # One request per connection first, so connection setup and warm-up are not timed.
        await asyncio.gather(*(conn.send(next_request()) for conn in connections))
        deadline = time.perf_counter() + seconds

        async def loop(conn: loadgen.Connection) -> None:
            nonlocal done, failure
            while time.perf_counter() < deadline and done < max_requests and failure is None:
                status, answer = await conn.send(next_request())
                if status != 200:
                    failure = _outcome(status, answer.decode(errors="replace"), "render")
                    return
                done += 1

        cpu0, own0 = cpu(), time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(loop(conn) for conn in connections))
        elapsed = time.perf_counter() - t0
        used, own = cpu() - cpu0, time.process_time() - own0
    finally:
        for conn in connections:
            await conn.close()
    if failure is not None:
        raise Failure(failure)
    return Throughput(done, elapsed, used, own)


class StreamResponse(msgspec.Struct):
    chunk: dict[str, Any]
    # Kept as raw bytes: the client only hands it back, so it is never parsed or re-encoded.
    stream_state: msgspec.Raw


class FinalMessage(msgspec.Struct):
    """Client-side accumulation of streamed deltas, to check both systems said the same."""

    reasoning: str = ""
    content: str = ""
    tool_calls: dict[int, list[str]] = {}
    finish_reason: str | None = None

    def add(self, chunk: dict[str, Any]) -> None:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            self.reasoning += delta.get("reasoning") or ""
            self.content += delta.get("content") or ""
            for call in delta.get("tool_calls") or []:
                slot = self.tool_calls.setdefault(int(call.get("index", 0)), ["", ""])
                function = call.get("function") or {}
                slot[0] += function.get("name") or ""
                slot[1] += function.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def summary(self) -> str:
        calls = ", ".join(
            f"{name}({len(args)} chars of arguments)" for name, args in self.tool_calls.values()
        )
        return (
            f"reasoning {len(self.reasoning)} chars, content {len(self.content)} chars, "
            f"tool calls: {calls or 'none'}, finish_reason {self.finish_reason}"
        )


def generate_chunk(request_id: str, ids: list[int], finish_reason: str | None) -> dict[str, Any]:
    """One /inference/v1/generate SSE payload, shaped like the golden corpus' chunks."""
    choice = {
        "index": 0,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": ids,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": None,
        "logprobs": None,
    }
    return {"request_id": request_id, "usage": None, "output_mode": "tokens", "choices": [choice]}


def generate_response(
    request_id: str, model: str, prompt_tokens: int, ids: list[int]
) -> dict[str, Any]:
    """A whole non-streaming generate response for batch derender."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + len(ids),
        "completion_tokens": len(ids),
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    choice = {
        "index": 0,
        "finish_reason": "stop",
        "stop_reason": None,
        "token_ids": ids,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": None,
        "logprobs": None,
    }
    return {
        "request_id": request_id,
        "model": model,
        "created": 1767225600,
        "usage": usage,
        "prompt_logprobs": None,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": None,
        "mm_placeholders": None,
        "metrics": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "output_mode": "tokens",
        "choices": [choice],
    }


class StreamRun(msgspec.Struct):
    outcome: Outcome
    calls: int = 0
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    request_bytes: list[int] = []
    response_bytes: list[int] = []
    final: FinalMessage | None = None
    call_s: list[float] = []


def stream_derender(
    client: loadgen.Client,
    cpu: CpuReader,
    base: dict[str, Any],
    ids: list[int],
    lean: bool,
    budget_s: float,
    request_id: str,
) -> StreamRun:
    """vLLM's documented client loop (contract §5.3): per call one generate chunk + last state.

    `base` holds model, prompt_tokens, prompt_token_ids and chat_request. In lean mode the calls
    after the first leave out prompt_token_ids and chat_request (the state carries what it needs).
    A stream that runs past `budget_s` of wall time stops and is reported as cut.
    """
    full = {key: msgspec.Raw(_encode(value)) for key, value in base.items()}
    slim = {k: v for k, v in full.items() if k not in ("prompt_token_ids", "chat_request")}
    state: msgspec.Raw | None = None
    final = FinalMessage()
    sent: list[int] = []
    received: list[int] = []
    call_s: list[float] = []
    cpu0 = cpu()
    t0 = time.perf_counter()
    for i, token in enumerate(ids):
        finish = "stop" if i == len(ids) - 1 else None
        fields = slim if lean and i > 0 else full
        body = _encode(
            {
                "stream": True,
                **fields,
                "generate_chunk": generate_chunk(request_id, [token], finish),
                "stream_state": state,
            }
        )
        started = time.perf_counter()
        try:
            response = client.post(CHAT_DERENDER, content=body, headers=JSON)
        except loadgen.ClientError as exc:
            return StreamRun(Outcome(ERROR, f"call {i + 1}: {type(exc).__name__} {exc}"[:200]), i)
        if response.status_code != 200:
            outcome = outcome_of(response, f"call {i + 1}")
            if lean and i > 0:
                outcome = Outcome(NOT_IMPLEMENTED, f"lean body rejected: {outcome.note}")
            return StreamRun(outcome, calls=i)
        call_s.append(time.perf_counter() - started)
        sent.append(len(body))
        received.append(len(response.content))
        decoded = msgspec.json.decode(response.content, type=StreamResponse)
        state = decoded.stream_state
        final.add(decoded.chunk)
        if time.perf_counter() - t0 > budget_s and i + 1 < len(ids):
            wall = time.perf_counter() - t0
            note = f"cut at the {budget_s:.0f} s budget after {i + 1} of {len(ids)} calls"
            return StreamRun(
                Outcome(SKIPPED, note), i + 1, wall, cpu() - cpu0, sent, received, None, call_s
            )
    wall = time.perf_counter() - t0
    return StreamRun(Outcome(), len(ids), wall, cpu() - cpu0, sent, received, final, call_s)


def predicted_stream_s(
    history: list[tuple[int, float]], last_call_s: list[float], n: int
) -> float | None:
    """Wall time for a stream of `n` chunks, from the finished (n, seconds) runs.

    Two runs give a power law. One run gives a per-call cost that grows linearly with the
    call index (fitted on its first and last quarters), which covers O(n) and O(n^2) streams.
    """
    if len(history) >= 2:
        (n0, s0), (n1, s1) = history[-2], history[-1]
        if s0 > 0 and s1 > 0 and n1 != n0:
            exponent = max(1.0, math.log(s1 / s0) / math.log(n1 / n0))
            return float(s1 * (n / n1) ** exponent)
    if len(last_call_s) < 8:
        return None
    quarter = len(last_call_s) // 4
    early = statistics.fmean(last_call_s[:quarter])
    late = statistics.fmean(last_call_s[-quarter:])
    at_early, at_late = quarter / 2, len(last_call_s) - quarter / 2
    slope = max(0.0, (late - early) / (at_late - at_early))
    base = max(0.0, early - slope * at_early)
    return base * n + slope * n * n / 2


class _ItemResult(msgspec.Struct):
    stream_state: str | None = None
    error: Any = None


class _StepResult(msgspec.Struct):
    items: list[_ItemResult]


class MultiRun(msgspec.Struct):
    outcome: Outcome
    steps: int = 0
    chunks: int = 0
    wall_s: float = 0.0
    server_cpu_s: float = 0.0


def multi_steps(streams: int, chunks: int, ids: int, least: int = 1) -> int:
    """Measured engine steps for a multi-stream row of ``streams`` streams: at least ``least``
    and enough for ``chunks`` chunks (server CPU is read in 10 ms ticks, so a row of 128 chunks
    could move by 78 µs per chunk on one tick), within the ``ids`` output ids (the first step
    is not measured)."""
    return max(1, min(ids - 1, max(least, -(-chunks // streams))))


def multi_stream(
    client: loadgen.Client,
    cpu: CpuReader,
    base: dict[str, Any],
    ids: list[int],
    streams: int,
    steps: int,
    mode: str,
    budget_s: float,
) -> MultiRun:
    """`streams` streams of `ids` advanced one id per engine step, `steps` measured steps.

    ``mode``: "json" or "msgpack" sends each step as one multi-stream call (items lean after a
    stream's first call); "single" sends each stream's chunk as its own call with the prompt and
    chat request, vLLM's documented loop. The first step (each stream's first call, which reads
    the prompt) is not measured: the row is the per-chunk cost of a running stream.
    """
    full = {key: msgspec.Raw(_encode(value)) for key, value in base.items()}
    # A stream's first item carries its prompt and chat request (pre-encoded for JSON).
    first = {
        "json": {key: full[key] for key in ("prompt_token_ids", "chat_request")},
        "msgpack": {key: base[key] for key in ("prompt_token_ids", "chat_request")},
    }
    encoders = {"json": _encode, "msgpack": msgspec.msgpack.encode}
    headers = {"json": JSON, "msgpack": MSGPACK}
    states: list[Any] = [None] * streams
    request_ids = [f"generate-tokens-chatcmpl-bench-multi-{streams}-{k}" for k in range(streams)]
    cpu0, t0 = 0.0, 0.0
    for step in range(steps + 1):
        if step == 1:
            cpu0, t0 = cpu(), time.perf_counter()
        finish = "stop" if step == len(ids) - 1 else None
        chunks = [generate_chunk(rid, [ids[step]], finish) for rid in request_ids]
        try:
            if mode == "single":
                for k, chunk in enumerate(chunks):
                    body = _encode(
                        {"stream": True, **full, "generate_chunk": chunk, "stream_state": states[k]}
                    )
                    response = client.post(CHAT_DERENDER, content=body, headers=JSON)
                    if response.status_code != 200:
                        return MultiRun(outcome_of(response, f"step {step}, stream {k}"), step)
                    states[k] = msgspec.json.decode(
                        response.content, type=StreamResponse
                    ).stream_state
            else:
                inputs = first[mode] if step == 0 else {}
                items = [
                    {"generate_chunk": chunk, "stream_state": states[k], **inputs}
                    for k, chunk in enumerate(chunks)
                ]
                body = encoders[mode]({"model": base["model"], "items": items})
                response = client.post(CHAT_DERENDER_STREAMS, content=body, headers=headers[mode])
                if response.status_code != 200:
                    return MultiRun(outcome_of(response, f"step {step}"), step)
                decode = msgspec.msgpack.decode if mode == "msgpack" else msgspec.json.decode
                result = decode(response.content, type=_StepResult)
                for k, item in enumerate(result.items):
                    if item.error is not None:
                        return MultiRun(
                            Outcome(ERROR, f"step {step}, stream {k}: {item.error}"[:200]), step
                        )
                    states[k] = item.stream_state
        except loadgen.ClientError as exc:
            return MultiRun(Outcome(ERROR, f"step {step}: {type(exc).__name__} {exc}"[:200]), step)
        if step and time.perf_counter() - t0 > budget_s and step < steps:
            note = f"cut at the {budget_s:.0f} s budget after {step} of {steps} steps"
            wall = time.perf_counter() - t0
            return MultiRun(Outcome(SKIPPED, note), step, step * streams, wall, cpu() - cpu0)
    wall = time.perf_counter() - t0
    return MultiRun(Outcome(), steps, steps * streams, wall, cpu() - cpu0)
