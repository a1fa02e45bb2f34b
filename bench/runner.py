"""Runs every workload against one system and records one row per measurement.

A row is written for every workload even when the system cannot run it (not implemented yet,
over the time budget, or did not start), so the report never silently drops a line.
"""

from __future__ import annotations

import statistics
import time

import msgspec

from bench import loadgen, measure
from bench.measure import CHAT_DERENDER, CHAT_RENDER, Failure
from bench.plan import Inputs, Plan, Progress, label
from bench.results import (
    NOT_IMPLEMENTED,
    OURS,
    OURS_LEAN,
    OURS_MSGPACK,
    OURS_ONE_BY_ONE,
    PEER,
    SKIPPED,
    BatchRow,
    BytesRow,
    LatencyRow,
    MultiStreamRow,
    MultiTurnRow,
    NoiseRow,
    Outcome,
    Results,
    StreamRow,
    ThroughputRow,
)
from bench.servers import Server, load_average

# A stream predicted to need more than this many budgets is not started; one that might
# nearly fit runs until the budget and reports how far it got.
_HOPELESS = 3


class Runner:
    """Runs every workload against one system and appends rows to `results`."""

    def __init__(self, results: Results, plan: Plan, data: Inputs, say: Progress):
        self.results = results
        self.plan = plan
        self.data = data
        self.say = say
        self.finals: dict[tuple[str, int], measure.FinalMessage] = {}

    def latency(self, name: str, server: Server) -> None:
        with loadgen.Client(server.base_url, 300.0) as client:
            for size in self.plan.latency_sizes:
                for tools in (False, True):
                    tokens = len(self.data.prompt_ids[(size, tools)])
                    row = LatencyRow(name, label(size), tools, tokens, Outcome())
                    try:
                        first = measure.post(
                            client, CHAT_RENDER, self.data.render_body(size, tools), "render"
                        )
                        rendered = msgspec.json.decode(first.content, type=measure.Rendered)
                        row.same_ids_as_hf_template = (
                            rendered.token_ids == self.data.prompt_ids[(size, tools)]
                        )
                        timing = measure.time_requests(
                            client,
                            server.cpu_seconds,
                            CHAT_RENDER,
                            self.data.render_bodies(size, tools),
                            self.plan.latency_reps,
                            self.plan.warmup,
                            "render",
                        )
                        row.requests = len(timing.samples_ms)
                        row.median_ms = timing.median_ms
                        row.p99_ms = measure.percentile(timing.samples_ms, 99)
                        row.server_cpu_ms_per_request = 1000 * timing.server_cpu_s / row.requests
                    except Failure as failure:
                        row.outcome = failure.outcome
                    self.results.render_latency.append(row)
                    done = f"median {row.median_ms:.2f} ms, p99 {row.p99_ms:.2f} ms"
                    what = f"render {row.label}{' +tools' if tools else ''} ({tokens} tok)"
                    self.say(f"{name}: {what}: {_show(row.outcome, done)}")

    def multi_turn(self, name: str, server: Server) -> None:
        """Each conversation's turns in order, one client; the last turn is timed, and the last
        turn of another new conversation is timed as its conversation's first request."""
        turns = self.data.multi_turns
        row = MultiTurnRow(name, turns, len(self.data.multi_turn_ids), Outcome())
        warm: list[float] = []
        cold: list[float] = []
        with loadgen.Client(server.base_url, 300.0) as client:
            try:
                for index in range(self.plan.multi_turn_conversations):
                    bodies = self.data.conversation_bodies(fresh=index > 0)
                    for body in bodies[:-1]:
                        measure.post(client, CHAT_RENDER, body, "render")
                    t0 = time.perf_counter()
                    last = measure.post(client, CHAT_RENDER, bodies[-1], "render")
                    warm.append((time.perf_counter() - t0) * 1000.0)
                    if index == 0:
                        rendered = msgspec.json.decode(last.content, type=measure.Rendered)
                        row.same_ids_as_hf_template = rendered.token_ids == self.data.multi_turn_ids
                    alone = self.data.conversation_bodies(fresh=True)[-1]
                    t0 = time.perf_counter()
                    measure.post(client, CHAT_RENDER, alone, "render")
                    cold.append((time.perf_counter() - t0) * 1000.0)
            except Failure as failure:
                row.outcome = failure.outcome
        if row.outcome.ok:
            row.conversations = len(warm)
            row.warm_median_ms = statistics.median(warm)
            row.cold_median_ms = statistics.median(cold)
        self.results.multi_turn.append(row)
        done = f"turn {turns}: {row.warm_median_ms:.2f} ms warm, {row.cold_median_ms:.2f} ms cold"
        self.say(f"{name}: multi-turn render: {_show(row.outcome, done)}")

    def noise_round(self, name: str, server: Server) -> None:
        """One repeat of two small workloads; the spread over repeats is the report's noise."""
        size, n = self.plan.latency_sizes[0], self.plan.stream_n[0]
        render = self._noise_row(name, f"render {label(size)} chat, median latency", "ms")
        if render.outcome.ok:
            with loadgen.Client(server.base_url, 300.0) as client:
                try:
                    timing = measure.time_requests(
                        client,
                        server.cpu_seconds,
                        CHAT_RENDER,
                        self.data.render_bodies(size, False),
                        self.plan.latency_reps,
                        self.plan.warmup,
                        "render",
                    )
                    render.values.append(timing.median_ms)
                except Failure as failure:
                    render.outcome = failure.outcome
        stream = self._noise_row(name, f"streaming derender n={n}, server CPU", "s")
        if stream.outcome.ok:
            with loadgen.Client(server.base_url, 600.0) as client:
                run = measure.stream_derender(
                    client,
                    server.cpu_seconds,
                    self.data.stream_base(size),
                    self.data.outputs[n],
                    False,
                    self.plan.stream_budget_s,
                    f"generate-tokens-chatcmpl-bench-noise-{n}",
                )
            if run.outcome.ok:
                stream.values.append(run.server_cpu_s)
            else:
                stream.outcome = run.outcome
        for row in (render, stream):
            done = f"{row.values[-1]:.3f} {row.unit}" if row.values else ""
            self.say(f"{name}: noise, {row.label}: {_show(row.outcome, done)}")

    def _noise_row(self, name: str, label: str, unit: str) -> NoiseRow:
        for row in self.results.latency_noise:
            if row.system == name and row.label == label:
                return row
        row = NoiseRow(name, label, unit, Outcome())
        self.results.latency_noise.append(row)
        return row

    def throughput(self, name: str, server: Server) -> None:
        size = self.plan.latency_sizes[0]
        bodies = self.data.render_bodies(size, False)
        tokens = len(self.data.prompt_ids[(size, False)])
        for clients in self.plan.concurrency:
            row = ThroughputRow(name, clients, tokens, Outcome())
            try:
                result = measure.throughput(
                    server.base_url,
                    server.cpu_seconds,
                    CHAT_RENDER,
                    bodies,
                    clients,
                    self.plan.throughput_s,
                    self.plan.throughput_max_requests,
                )
                row.requests = result.requests
                row.seconds = result.seconds
                row.requests_per_s = result.requests / result.seconds
                row.server_cpu_s = result.server_cpu_s
                row.client_cpu_s = result.client_cpu_s
            except Failure as failure:
                row.outcome = failure.outcome
            self.results.throughput.append(row)
            done = f"{row.requests_per_s:.1f} req/s"
            self.say(f"{name}: throughput x{clients}: {_show(row.outcome, done)}")

    def streams(self, name: str, server: Server, lean: bool) -> None:
        row_name = OURS_LEAN if lean else name
        size = self.plan.latency_sizes[0]
        base = self.data.stream_base(size)
        history: list[tuple[int, float]] = []
        last_call_s: list[float] = []
        with loadgen.Client(server.base_url, 600.0) as client:
            blocked: Outcome | None = None
            for n in self.plan.stream_n:
                row = StreamRow(row_name, n, Outcome())
                guess = measure.predicted_stream_s(history, last_call_s, n)
                if blocked is not None:
                    row.outcome = blocked
                elif name == PEER and n >= self.plan.ours_only_n:
                    row.outcome = Outcome(
                        SKIPPED, f"render-service only (predicted {_secs(guess)} for vLLM)"
                    )
                elif guess is not None and guess > _HOPELESS * self.plan.stream_budget_s:
                    row.outcome = Outcome(
                        SKIPPED,
                        f"not run: predicted {_secs(guess)} from the smaller runs, more than "
                        f"{_HOPELESS}x the {self.plan.stream_budget_s:.0f} s budget",
                    )
                else:
                    run = measure.stream_derender(
                        client,
                        server.cpu_seconds,
                        base,
                        self.data.outputs[n],
                        lean,
                        self.plan.stream_budget_s,
                        f"generate-tokens-chatcmpl-bench-stream-{n}",
                    )
                    row.outcome, row.calls, row.wall_s, row.server_cpu_s = (
                        run.outcome,
                        run.calls,
                        run.wall_s,
                        run.server_cpu_s,
                    )
                    if run.outcome.ok:
                        history.append((n, run.wall_s))
                        last_call_s = run.call_s
                        if run.final is not None:
                            self.finals[(row_name, n)] = run.final
                            row.final_summary = run.final.summary()
                        peer_final = self.finals.get((PEER, n))
                        if name != PEER and peer_final is not None and run.final is not None:
                            row.final_matches_peer = peer_final == run.final
                self.results.stream_derender.append(row)
                done = f"server CPU {row.server_cpu_s:.2f} s, wall {row.wall_s:.2f} s"
                self.say(f"{row_name}: stream derender n={n}: {_show(row.outcome, done)}")
                if row.outcome.status == NOT_IMPLEMENTED:
                    blocked = row.outcome

    def batches(self, name: str, server: Server) -> None:
        size = self.plan.latency_sizes[0]
        with loadgen.Client(server.base_url, 600.0) as client:
            for n in self.plan.stream_n:
                row = BatchRow(name, n, Outcome())
                try:
                    timing = measure.time_requests(
                        client,
                        server.cpu_seconds,
                        CHAT_DERENDER,
                        measure.same_body(self.data.batch_body(size, n)),
                        self.plan.batch_reps,
                        1,
                        "derender",
                    )
                    row.requests = len(timing.samples_ms)
                    row.median_ms = timing.median_ms
                    row.server_cpu_ms_per_request = 1000 * timing.server_cpu_s / row.requests
                except Failure as failure:
                    row.outcome = failure.outcome
                self.results.batch_derender.append(row)
                done = f"median {row.median_ms:.1f} ms"
                self.say(f"{name}: batch derender n={n}: {_show(row.outcome, done)}")

    def bytes_per_chunk(self, name: str, server: Server, lean: bool) -> None:
        row_name = OURS_LEAN if lean else name
        n = self.plan.stream_n[0]
        ids = self.data.outputs[n][: self.plan.bytes_chunks]
        with loadgen.Client(server.base_url, 600.0) as client:
            for size in self.plan.bytes_prompts:
                base = self.data.stream_base(size)
                run = measure.stream_derender(
                    client,
                    server.cpu_seconds,
                    base,
                    ids,
                    lean,
                    self.plan.stream_budget_s,
                    f"generate-tokens-chatcmpl-bench-bytes-{size}",
                )
                row = BytesRow(row_name, base["prompt_tokens"], run.outcome, chunks=run.calls)
                if run.request_bytes:
                    row.request_bytes_mean = sum(run.request_bytes) / len(run.request_bytes)
                    row.request_bytes_last = run.request_bytes[-1]
                    row.response_bytes_mean = sum(run.response_bytes) / len(run.response_bytes)
                    row.response_bytes_last = run.response_bytes[-1]
                self.results.bytes_per_chunk.append(row)
                done = (
                    f"request {row.request_bytes_mean:.0f} B, "
                    f"response {row.response_bytes_mean:.0f} B"
                )
                what = f"bytes per chunk, {label(size)} prompt"
                self.say(f"{row_name}: {what}: {_show(row.outcome, done)}")

    def multi_streams(self, name: str, server: Server) -> None:
        """Per-chunk CPU of many concurrent streams: ours through the multi-stream endpoint
        (JSON and msgpack) and one by one, vLLM one by one."""
        base = self.data.stream_base(self.plan.latency_sizes[0])
        ids = self.data.outputs[self.plan.stream_n[0]]
        modes = [(OURS, "json"), (OURS_MSGPACK, "msgpack"), (OURS_ONE_BY_ONE, "single")]
        with loadgen.Client(server.base_url, 600.0) as client:
            for row_name, mode in modes if name == OURS else [(name, "single")]:
                for streams in self.plan.multi_streams:
                    # One call per step costs little per chunk: such a row runs more steps, so
                    # its total is many 10 ms CPU ticks (one by one, each chunk is a call).
                    steps = self.plan.multi_steps
                    if mode != "single":
                        steps = measure.multi_steps(
                            streams, self.plan.multi_chunks, len(ids), steps
                        )
                    run = measure.multi_stream(
                        client,
                        server.cpu_seconds,
                        base,
                        ids,
                        streams,
                        steps,
                        mode,
                        self.plan.stream_budget_s,
                    )
                    row = MultiStreamRow(
                        row_name,
                        streams,
                        run.outcome,
                        run.steps,
                        run.chunks,
                        run.wall_s,
                        run.server_cpu_s,
                    )
                    self.results.multi_stream.append(row)
                    per_chunk = 1e6 * row.server_cpu_s / max(1, row.chunks)
                    done = f"{per_chunk:.0f} us server CPU per chunk"
                    self.say(f"{row_name}: {streams} streams: {_show(row.outcome, done)}")

    def all(self, name: str, server: Server) -> None:
        self._load(name, "render latency")
        self.latency(name, server)
        self._load(name, "throughput")
        self.throughput(name, server)
        self._load(name, "multi-turn render")
        self.multi_turn(name, server)
        self._load(name, "streaming derender")
        self.streams(name, server, lean=False)
        if name == OURS:
            self.streams(name, server, lean=True)
        self._load(name, "multi-stream derender")
        self.multi_streams(name, server)
        self._load(name, "batch derender")
        self.batches(name, server)
        self._load(name, "bytes per call")
        self.bytes_per_chunk(name, server, lean=False)
        if name == OURS:
            self.bytes_per_chunk(name, server, lean=True)

    def _load(self, name: str, workload: str) -> None:
        """Load average when a workload starts: wall-time numbers suffer when it is high."""
        self.results.meta.load_average[f"{name}, {workload}"] = load_average()

    def unavailable(self, name: str, outcome: Outcome) -> None:
        """Rows for a system that could not be started, so the report still lists them."""
        plan, data, res = self.plan, self.data, self.results
        for size in plan.latency_sizes:
            for tools in (False, True):
                tokens = len(data.prompt_ids[(size, tools)])
                res.render_latency.append(LatencyRow(name, label(size), tools, tokens, outcome))
        size, n = plan.latency_sizes[0], plan.stream_n[0]
        res.latency_noise.append(
            NoiseRow(name, f"render {label(size)} chat, median latency", "ms", outcome)
        )
        res.latency_noise.append(
            NoiseRow(name, f"streaming derender n={n}, server CPU", "s", outcome)
        )
        res.multi_turn.append(
            MultiTurnRow(name, plan.multi_turns, len(data.multi_turn_ids), outcome)
        )
        tokens = len(data.prompt_ids[(plan.latency_sizes[0], False)])
        res.throughput.extend(ThroughputRow(name, c, tokens, outcome) for c in plan.concurrency)
        names = [name, OURS_LEAN] if name == OURS else [name]
        for row_name in names:
            res.stream_derender.extend(StreamRow(row_name, n, outcome) for n in plan.stream_n)
            for size in plan.bytes_prompts:
                tokens = len(data.prompt_ids[(size, True)])
                res.bytes_per_chunk.append(BytesRow(row_name, tokens, outcome))
        res.batch_derender.extend(BatchRow(name, n, outcome) for n in plan.stream_n)
        multi = [name, OURS_MSGPACK, OURS_ONE_BY_ONE] if name == OURS else [name]
        for row_name in multi:
            res.multi_stream.extend(
                MultiStreamRow(row_name, streams, outcome) for streams in plan.multi_streams
            )


def _show(outcome: Outcome, text: str) -> str:
    return text if outcome.ok else f"{outcome.status} ({outcome.note})"


def _secs(value: float | None) -> str:
    return "?" if value is None else f"~{value:.0f} s"
