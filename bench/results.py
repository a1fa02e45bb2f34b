"""The raw numbers of one bench run: what the report is drawn from and what lands in the JSON.

Every row names its system and carries an `Outcome`, so a workload that a system cannot run yet
still appears in the report ("not implemented yet") instead of silently disappearing.
"""

from __future__ import annotations

import msgspec

PEER = "vLLM 0.33.0"
OURS = "render-service"
OURS_LEAN = "render-service (lean)"
OURS_MSGPACK = "render-service (msgpack)"
OURS_ONE_BY_ONE = "render-service (one by one)"

OK = "ok"
NOT_IMPLEMENTED = "not implemented yet"
ERROR = "error"
SKIPPED = "skipped"


class Outcome(msgspec.Struct, frozen=True):
    status: str = OK
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK


class Meta(msgspec.Struct):
    started_utc: str
    finished_utc: str
    quick: bool
    model: str
    parser_flags: list[str]
    machine: str
    commands: dict[str, str]
    system_notes: dict[str, str]
    settings: dict[str, str]
    load_average: dict[str, str] = {}


class LatencyRow(msgspec.Struct):
    system: str
    label: str
    tools: bool
    prompt_tokens: int
    outcome: Outcome
    requests: int = 0
    median_ms: float = 0.0
    p99_ms: float = 0.0
    server_cpu_ms_per_request: float = 0.0
    same_ids_as_hf_template: bool | None = None


class NoiseRow(msgspec.Struct):
    """One workload repeated a few times (alternating systems); one value per repeat."""

    system: str
    label: str
    unit: str
    outcome: Outcome
    values: list[float] = []

    @property
    def spread_pct(self) -> float:
        """(max - min) of the repeats relative to their median."""
        if not self.values:
            return 0.0
        ordered = sorted(self.values)
        mid = ordered[len(ordered) // 2]
        return 100.0 * (ordered[-1] - ordered[0]) / mid if mid else 0.0


class ThroughputRow(msgspec.Struct):
    system: str
    concurrency: int
    prompt_tokens: int
    outcome: Outcome
    requests: int = 0
    seconds: float = 0.0
    requests_per_s: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0


class StreamRow(msgspec.Struct):
    system: str
    n: int
    outcome: Outcome
    calls: int = 0
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    final_matches_peer: bool | None = None
    final_summary: str = ""


class BatchRow(msgspec.Struct):
    system: str
    n: int
    outcome: Outcome
    requests: int = 0
    median_ms: float = 0.0
    server_cpu_ms_per_request: float = 0.0


class BytesRow(msgspec.Struct):
    system: str
    prompt_tokens: int
    outcome: Outcome
    chunks: int = 0
    request_bytes_mean: float = 0.0
    request_bytes_last: int = 0
    response_bytes_mean: float = 0.0
    response_bytes_last: int = 0


class MultiStreamRow(msgspec.Struct):
    """One engine step's chunks of `streams` streams: one multi-stream call per step (ours), or
    the same chunks sent one by one (vLLM, which has no multi-stream endpoint)."""

    system: str
    streams: int
    outcome: Outcome
    steps: int = 0
    chunks: int = 0
    wall_s: float = 0.0
    server_cpu_s: float = 0.0


class MultiTurnRow(msgspec.Struct):
    """The last turn of a conversation growing by one turn per request, rendered right after
    the turns before it ("warm") and as the first request of its conversation ("cold")."""

    system: str
    turns: int
    prompt_tokens: int
    outcome: Outcome
    conversations: int = 0
    warm_median_ms: float = 0.0
    cold_median_ms: float = 0.0
    same_ids_as_hf_template: bool | None = None


class Results(msgspec.Struct):
    meta: Meta
    render_latency: list[LatencyRow] = []
    latency_noise: list[NoiseRow] = []
    throughput: list[ThroughputRow] = []
    stream_derender: list[StreamRow] = []
    batch_derender: list[BatchRow] = []
    bytes_per_chunk: list[BytesRow] = []
    multi_stream: list[MultiStreamRow] = []
    multi_turn: list[MultiTurnRow] = []


def encode(results: Results) -> bytes:
    return msgspec.json.format(msgspec.json.encode(results), indent=2)


def decode(data: bytes) -> Results:
    return msgspec.json.decode(data, type=Results)
