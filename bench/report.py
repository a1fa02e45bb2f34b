"""Turn one run's `Results` into a Markdown report, PNG plots and the raw JSON.

Every figure in the report is read from `Results`; nothing is typed in. Ratios are "how many
times better render-service is": vLLM ÷ render-service for times and bytes, render-service ÷
vLLM for throughput.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, TypeVar

from bench.results import (
    OURS,
    OURS_LEAN,
    OURS_MSGPACK,
    OURS_ONE_BY_ONE,
    PEER,
    SKIPPED,
    LatencyRow,
    MultiStreamRow,
    MultiTurnRow,
    Outcome,
    Results,
    StreamRow,
    encode,
)

Row = TypeVar("Row")


class _HasOutcome(Protocol):
    @property
    def outcome(self) -> Outcome: ...


R = TypeVar("R", bound=_HasOutcome)


def write(results: Results, out_dir: Path, stem: str) -> list[Path]:
    """Write `<stem>.md`, `<stem>.json` and `<stem>-*.png` into `out_dir`; refresh index.md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f"{stem}.json"
    raw.write_bytes(encode(results) + b"\n")
    plots = draw_plots(results, out_dir, stem)
    page = out_dir / f"{stem}.md"
    page.write_text(render_markdown(results, raw.name, [p.name for p in plots]))
    index = write_index(out_dir)
    return [page, raw, *plots, index]


def write_index(out_dir: Path) -> Path:
    reports = sorted((p for p in out_dir.glob("*.md") if p.name != "index.md"), reverse=True)
    lines = [
        "# Bench reports",
        "",
        "Newest first; each was written by `python -m bench compare`.",
        "",
    ]
    lines += [f"- [{p.stem}]({p.name})" for p in reports]
    index = out_dir / "index.md"
    index.write_text("\n".join(lines) + "\n")
    return index


def _ratio(better_when_smaller: bool, peer: float | None, ours: float | None) -> str:
    if not peer or not ours:
        return "–"
    value = peer / ours if better_when_smaller else ours / peer
    return f"{value:.2f}×" if value < 10 else f"{value:.0f}×"


def _find(rows: Iterable[Row], **match: object) -> Row | None:
    for row in rows:
        if all(getattr(row, key) == value for key, value in match.items()):
            return row
    return None


def _ok_value(row: _HasOutcome | None, field: str) -> float | None:
    if row is None or not row.outcome.ok:
        return None
    return float(getattr(row, field))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


class _Notes:
    """Footnotes: each distinct (system, note) once, so long error texts stay out of the tables."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def cell(self, system: str, row: R | None, text: Callable[[R], str]) -> str:
        if row is None:
            return "not measured"
        if row.outcome.ok:
            return text(row)
        if row.outcome.note:
            item = f"{system}: {row.outcome.status}: {row.outcome.note}"
            if item not in self.items:
                self.items.append(item)
            return f"{row.outcome.status} [{self.items.index(item) + 1}]"
        return row.outcome.status

    def lines(self) -> list[str]:
        return [f"[{i}] {text}  " for i, text in enumerate(self.items, 1)]


def render_markdown(results: Results, raw_name: str, plot_names: list[str]) -> str:
    meta = results.meta
    notes = _Notes()
    out = [
        f"# render-service vs vLLM 0.33.0: {'quick' if meta.quick else 'full'} bench",
        "",
        f"Run {meta.started_utc} → {meta.finished_utc} (UTC) on {meta.machine}. "
        f"Model `{meta.model}`, parser flags `{' '.join(meta.parser_flags)}` on both servers. "
        f"Raw numbers: [{raw_name}]({raw_name}). Command: "
        f"`python -m bench compare{' --quick' if meta.quick else ''}`.",
        "",
        "Ratios say how many times better render-service is (vLLM ÷ render-service for times "
        "and bytes, render-service ÷ vLLM for throughput). Each server ran alone on the machine "
        "while measured (the other one idle); the client runs on the same 2 cores, so it takes "
        "CPU from the server under load.",
        "",
    ]
    out += _noise_section(results)
    out += _latency_section(results, notes)
    out += _throughput_section(results, notes)
    out += _multi_turn_section(results, notes)
    out += _stream_section(results, notes)
    out += _multi_section(results, notes)
    out += _batch_section(results, notes)
    out += _bytes_section(results, notes)
    out += ["## Plots", ""]
    out += [f"![{name}]({name})" for name in plot_names]
    out += ["", "## Notes", ""]
    out += notes.lines() or ["(none)"]
    out += ["", "## Setup", ""]
    out += [f"- {system}: `{command}`" for system, command in meta.commands.items()]
    out += [f"- {system}: {note}" for system, note in meta.system_notes.items()]
    out += ["- plan: " + ", ".join(f"{k}={v}" for k, v in meta.settings.items())]
    out += [
        "- load average (1/5/15 min) "
        + ", ".join(f"{when}: {value}" for when, value in meta.load_average.items())
    ]
    return "\n".join(out) + "\n"


def _noise_section(results: Results) -> list[str]:
    out = ["## How noisy", ""]
    rows = []
    order = (PEER, OURS, OURS_LEAN)
    for row in sorted(results.latency_noise, key=lambda r: order.index(r.system)):
        if row.outcome.ok and row.values:
            runs = ", ".join(f"{v:.3g}" for v in row.values)
            rows.append([row.system, row.label, f"{runs} {row.unit}", f"{row.spread_pct:.1f} %"])
        else:
            rows.append([row.system, row.label, row.outcome.status, "–"])
    out += _table(["system", "workload", "each repeat", "spread (max−min)/median"], rows)
    measured = [r for r in results.latency_noise if r.outcome.ok and len(r.values) > 1]
    if measured:
        worst = max(r.spread_pct for r in measured)
        repeats = max(len(r.values) for r in measured)
        out += [
            "",
            f"Each workload was repeated {repeats} times, alternating between the running "
            f"systems; the repeats were up to {worst:.0f} % apart, so ratios within that of 1× "
            "are noise. "
            f"Load average (1/5/15 min) at start {results.meta.load_average.get('start', '?')}, "
            f"at end {results.meta.load_average.get('end', '?')} (per workload under Setup): "
            "other work on the machine widens the spread and slows wall times more than server "
            "CPU times. CPU time is read in 10 ms ticks.",
        ]
    return [*out, ""]


def _latency_section(results: Results, notes: _Notes) -> list[str]:
    rows = []
    keys = []
    for row in results.render_latency:
        if (row.label, row.tools) not in keys:
            keys.append((row.label, row.tools))
    for label, tools in keys:
        peer = _find(results.render_latency, system=PEER, label=label, tools=tools)
        ours = _find(results.render_latency, system=OURS, label=label, tools=tools)
        tokens = next(r.prompt_tokens for r in (peer, ours) if r is not None)
        rows.append(
            [
                f"{label}{' + tools' if tools else ''}",
                str(tokens),
                notes.cell(PEER, peer, lambda r: f"{r.median_ms:.2f} / {r.p99_ms:.2f}"),
                notes.cell(OURS, ours, lambda r: f"{r.median_ms:.2f} / {r.p99_ms:.2f}"),
                _ratio(True, _ok_value(peer, "median_ms"), _ok_value(ours, "median_ms")),
                notes.cell(PEER, peer, lambda r: f"{r.server_cpu_ms_per_request:.2f}"),
                notes.cell(OURS, ours, lambda r: f"{r.server_cpu_ms_per_request:.2f}"),
                _flags(peer, ours),
            ]
        )
    reps = {r.requests for r in results.render_latency if r.outcome.ok}
    header = [
        "chat prompt",
        "tokens",
        f"{PEER} median / p99 ms",
        f"{OURS} median / p99 ms",
        "ratio (median)",
        f"{PEER} server CPU ms/req",
        f"{OURS} server CPU ms/req",
        "ids = HF template (vLLM / ours)",
    ]
    return [
        "## Render latency (POST /v1/chat/completions/render, one client)",
        "",
        f"Requests per row: {', '.join(map(str, sorted(reps))) or '–'} after warm-up, one at a "
        "time on one keep-alive connection of the bench's raw client; with fewer than 100 requests p99 is the slowest request. No two requests are the same (the "
        'last user message ends with a new tag), so whole-request caches do not hit. "ids = HF '
        "template\": the untagged request rendered to the ids of transformers' "
        "`apply_chat_template`.",
        "",
        *_table(header, rows),
        "",
    ]


def _throughput_section(results: Results, notes: _Notes) -> list[str]:
    rows = []
    for clients in sorted({r.concurrency for r in results.throughput}):
        peer = _find(results.throughput, system=PEER, concurrency=clients)
        ours = _find(results.throughput, system=OURS, concurrency=clients)
        rows.append(
            [
                str(clients),
                notes.cell(PEER, peer, lambda r: f"{r.requests_per_s:.1f}"),
                notes.cell(OURS, ours, lambda r: f"{r.requests_per_s:.1f}"),
                _ratio(False, _ok_value(peer, "requests_per_s"), _ok_value(ours, "requests_per_s")),
                notes.cell(PEER, peer, lambda r: _per_req(r.server_cpu_s, r.requests)),
                notes.cell(OURS, ours, lambda r: _per_req(r.server_cpu_s, r.requests)),
                notes.cell(PEER, peer, lambda r: _per_req(r.client_cpu_s, r.requests)),
                notes.cell(OURS, ours, lambda r: _per_req(r.client_cpu_s, r.requests)),
            ]
        )
    tokens = {r.prompt_tokens for r in results.throughput}
    header = [
        "clients",
        f"{PEER} req/s",
        f"{OURS} req/s",
        "ratio",
        f"{PEER} server CPU ms/req",
        f"{OURS} server CPU ms/req",
        f"client CPU ms/req ({PEER})",
        f"client CPU ms/req ({OURS})",
    ]
    return [
        "## Render throughput (concurrent clients, chat prompt of "
        f"{', '.join(map(str, sorted(tokens)))} tokens)",
        "",
        "The load generator is one Python process (asyncio, one raw keep-alive HTTP/1.1 "
        "connection per client) on the same cores; its own CPU per request is listed so a "
        "client-bound row can be recognised.",
        "",
        *_table(header, rows),
        "",
    ]


def _per_req(seconds: float, requests: int) -> str:
    return f"{1000 * seconds / requests:.2f}" if requests else "–"


def _stream_section(results: Results, notes: _Notes) -> list[str]:
    rows = []
    for n in sorted({r.n for r in results.stream_derender}):
        peer = _find(results.stream_derender, system=PEER, n=n)
        ours = _find(results.stream_derender, system=OURS, n=n)
        lean = _find(results.stream_derender, system=OURS_LEAN, n=n)

        rows.append(
            [
                str(n),
                _stream_cell(notes, PEER, peer),
                _stream_cell(notes, OURS, ours),
                _ratio(True, _ok_value(peer, "server_cpu_s"), _ok_value(ours, "server_cpu_s")),
                _stream_cell(notes, OURS_LEAN, lean),
                _ratio(True, _ok_value(peer, "server_cpu_s"), _ok_value(lean, "server_cpu_s")),
                _same(ours, lean),
            ]
        )
    header = [
        "n chunks",
        f"{PEER} server CPU s / wall s",
        f"{OURS} CPU s / wall s",
        "ratio (CPU)",
        f"{OURS_LEAN} CPU s / wall s",
        "ratio (CPU, lean)",
        "same message as vLLM (ours / lean)",
    ]
    slopes = [
        f"- {system}: server CPU grows as n^{exponent:.2f} from n={lo} to n={hi}"
        for system in (PEER, OURS, OURS_LEAN)
        for lo, hi, exponent in growth_exponents(results.stream_derender, system)
    ]
    finals = [
        f"- {r.system}, n={r.n}: {r.final_summary}"
        for r in results.stream_derender
        if r.outcome.ok and r.final_summary
    ]
    return [
        "## Streaming derender (qwen3 + hermes, one output token per call)",
        "",
        "vLLM's documented client loop: each call sends one generate chunk and the previous "
        "`stream_state` (plus `prompt_token_ids` and `chat_request`, required with a parser). "
        "The output is `<think>` reasoning `</think>` answer, one hermes `<tool_call>`, "
        "`<|im_end|>`; the prompt is the ~1k chat with tools. Lean: calls after the first leave "
        "out `prompt_token_ids` and `chat_request`. Server CPU is utime + stime of the server's "
        'process tree from /proc. "Same message" compares the accumulated reasoning, content, '
        "tool calls and finish_reason with vLLM's stream of the same n.",
        "",
        *_table(header, rows),
        "",
        "Measured growth (log-log slope between consecutive finished runs; 1 is linear):",
        "",
        *(slopes or ["- (fewer than two finished runs per system)"]),
        "",
        "What each finished stream said (accumulated by the client):",
        "",
        *(finals or ["- (no finished stream)"]),
        "",
    ]


def _stream_cell(notes: _Notes, system: str, row: StreamRow | None) -> str:
    text = notes.cell(system, row, lambda r: f"{r.server_cpu_s:.3f} / {r.wall_s:.2f}")
    if row is not None and row.outcome.status == SKIPPED and row.calls:
        # A stream cut at the budget still tells how far it got and what that cost.
        text += f": {row.server_cpu_s:.1f} / {row.wall_s:.0f} for the first {row.calls} calls"
    return text


def growth_exponents(rows: list[StreamRow], system: str) -> list[tuple[int, int, float]]:
    """(n_lo, n_hi, slope of log CPU over log n) for consecutive finished runs of `system`."""
    points = sorted((r.n, r.server_cpu_s) for r in rows if r.system == system and r.outcome.ok)
    out = []
    for (n0, c0), (n1, c1) in itertools.pairwise(points):
        if c0 > 0 and c1 > 0 and n1 > n0:
            out.append((n0, n1, math.log(c1 / c0) / math.log(n1 / n0)))
    return out


def _multi_turn_section(results: Results, notes: _Notes) -> list[str]:
    if not results.multi_turn:
        return []
    peer = _find(results.multi_turn, system=PEER)
    ours = _find(results.multi_turn, system=OURS)
    row = next(r for r in (peer, ours) if r is not None)
    rows = [
        [
            f"turn {row.turns} after turns 1-{row.turns - 1}",
            notes.cell(PEER, peer, lambda r: f"{r.warm_median_ms:.2f}"),
            notes.cell(OURS, ours, lambda r: f"{r.warm_median_ms:.2f}"),
            _ratio(True, _ok_value(peer, "warm_median_ms"), _ok_value(ours, "warm_median_ms")),
        ],
        [
            f"turn {row.turns} cold (its conversation's first request)",
            notes.cell(PEER, peer, lambda r: f"{r.cold_median_ms:.2f}"),
            notes.cell(OURS, ours, lambda r: f"{r.cold_median_ms:.2f}"),
            _ratio(True, _ok_value(peer, "cold_median_ms"), _ok_value(ours, "cold_median_ms")),
        ],
        [
            "after ÷ cold",
            notes.cell(PEER, peer, lambda r: f"{r.warm_median_ms / r.cold_median_ms:.2f}"),
            notes.cell(OURS, ours, lambda r: f"{r.warm_median_ms / r.cold_median_ms:.2f}"),
            "",
        ],
    ]
    counts = {r.conversations for r in results.multi_turn if r.outcome.ok}
    return [
        f"## Multi-turn render (one conversation growing by one turn per request, {row.turns} "
        "turns)",
        "",
        f"Median wall ms of one client's render of turn {row.turns} ({row.prompt_tokens} tokens "
        "with three tools: a system prompt, then user and assistant turns of 60 and 120 words), "
        f"over {', '.join(map(str, sorted(counts))) or '–'} conversations: right after the "
        "conversation's earlier turns, and as the first request of another new conversation. "
        f"Turn {row.turns} = HF template ids (vLLM / ours): {_flags(peer, ours)}.",
        "",
        *_table(["turn", f"{PEER} ms", f"{OURS} ms", "ratio"], rows),
        "",
    ]


def _flags(*rows: LatencyRow | MultiTurnRow | None) -> str:
    marks = []
    for row in rows:
        if row is None or row.same_ids_as_hf_template is None:
            marks.append("–")
        else:
            marks.append("yes" if row.same_ids_as_hf_template else "NO")
    return " / ".join(marks)


def _same(*rows: StreamRow | None) -> str:
    marks = []
    for row in rows:
        if row is None or row.final_matches_peer is None:
            marks.append("–")
        else:
            marks.append("yes" if row.final_matches_peer else "NO")
    return " / ".join(marks)


def _per_chunk_us(row: MultiStreamRow | None) -> float | None:
    """Server CPU per chunk in microseconds, of a finished row or one cut at the budget (its
    chunks so far are as much a per-chunk figure as a whole run's)."""
    if row is None or not row.chunks or not (row.outcome.ok or row.outcome.status == SKIPPED):
        return None
    return 1e6 * row.server_cpu_s / row.chunks


def _multi_cell(notes: _Notes, system: str, row: MultiStreamRow | None) -> str:
    text = notes.cell(system, row, lambda r: f"{_per_chunk_us(r):.0f}")
    value = _per_chunk_us(row)
    if row is not None and not row.outcome.ok and value is not None:
        text += f": {value:.0f} over the first {row.steps} steps"
    return text


def _multi_section(results: Results, notes: _Notes) -> list[str]:
    if not results.multi_stream:
        return []
    systems = (PEER, OURS_ONE_BY_ONE, OURS, OURS_MSGPACK)
    rows = []
    for streams in sorted({r.streams for r in results.multi_stream}):
        found = {s: _find(results.multi_stream, system=s, streams=streams) for s in systems}
        peer = _per_chunk_us(found[PEER])
        row = [str(streams)]
        for system in systems:
            row.append(_multi_cell(notes, system, found[system]))
            if system != PEER:
                row.append(_ratio(True, peer, _per_chunk_us(found[system])))
        rows.append(row)
    header = ["streams", f"{PEER} one by one"]
    for system in systems[1:]:
        header += [system, "ratio"]
    return [
        "## Multi-stream derender (server CPU µs per chunk, one engine step for many streams)",
        "",
        "Each of N streams (the ~1k chat with tools, the qwen3 + hermes output) gets one output "
        "token per engine step. render-service: one `POST /v1/chat/completions/derender/streams` "
        "per step with N lean items (JSON, or msgpack both ways), and the same chunks one by one "
        "with vLLM's full bodies; vLLM (no such endpoint): the same chunks one by one, vLLM's "
        "documented loop. The first step (each stream's first call, which reads the prompt) is "
        "not measured; the table is the cost of a running stream's chunk.",
        "",
        *_table(header, rows),
        "",
        *_against_whole_streams(results),
    ]


def _against_whole_streams(results: Results) -> list[str]:
    """Our multi-stream chunk against vLLM's average chunk over its longest finished stream
    (what a chunk costs vLLM once its stream is long: its per-chunk cost grows with n)."""
    finished = [r for r in results.stream_derender if r.system == PEER and r.outcome.ok and r.n]
    ours = [r for r in results.multi_stream if r.system == OURS and _per_chunk_us(r) is not None]
    if not finished or not ours:
        return []
    longest = max(finished, key=lambda r: r.n)
    widest = max(ours, key=lambda r: r.streams)
    peer_us = 1e6 * longest.server_cpu_s / longest.n
    ours_us = _per_chunk_us(widest)
    return [
        f"Against whole streams: {PEER}'s server CPU per chunk over its {longest.n}-chunk stream "
        f"(streaming derender above) is {peer_us:.0f} µs; ours at {widest.streams} streams in "
        f"one call per step, {ours_us:.0f} µs: {_ratio(True, peer_us, ours_us)} less.",
        "",
    ]


def _batch_section(results: Results, notes: _Notes) -> list[str]:
    rows = []
    for n in sorted({r.n for r in results.batch_derender}):
        peer = _find(results.batch_derender, system=PEER, n=n)
        ours = _find(results.batch_derender, system=OURS, n=n)
        rows.append(
            [
                str(n),
                notes.cell(PEER, peer, lambda r: f"{r.median_ms:.2f}"),
                notes.cell(OURS, ours, lambda r: f"{r.median_ms:.2f}"),
                _ratio(True, _ok_value(peer, "median_ms"), _ok_value(ours, "median_ms")),
                notes.cell(PEER, peer, lambda r: f"{r.server_cpu_ms_per_request:.2f}"),
                notes.cell(OURS, ours, lambda r: f"{r.server_cpu_ms_per_request:.2f}"),
            ]
        )
    header = [
        "n tokens",
        f"{PEER} median ms",
        f"{OURS} median ms",
        "ratio",
        f"{PEER} server CPU ms/req",
        f"{OURS} server CPU ms/req",
    ]
    return ["## Batch derender (the same tokens in one request)", "", *_table(header, rows), ""]


def _bytes_section(results: Results, notes: _Notes) -> list[str]:
    rows = []
    for tokens in sorted({r.prompt_tokens for r in results.bytes_per_chunk}):
        group = {
            system: _find(results.bytes_per_chunk, system=system, prompt_tokens=tokens)
            for system in (PEER, OURS, OURS_LEAN)
        }
        chunks = max(
            (r.chunks for r in group.values() if r is not None and r.outcome.ok), default=0
        )
        row = [str(tokens), str(chunks)]
        for system, item in group.items():
            row.append(
                notes.cell(
                    system,
                    item,
                    lambda r: f"{r.request_bytes_mean:.0f} / {r.request_bytes_last}",
                )
            )
        for system, item in group.items():
            row.append(notes.cell(system, item, lambda r: f"{r.response_bytes_mean:.0f}"))
        peer_mean = _ok_value(group[PEER], "request_bytes_mean")
        row.append(_ratio(True, peer_mean, _ok_value(group[OURS], "request_bytes_mean")))
        row.append(_ratio(True, peer_mean, _ok_value(group[OURS_LEAN], "request_bytes_mean")))
        rows.append(row)
    header = [
        "prompt tokens",
        "chunks",
        f"{PEER} request B mean / last",
        f"{OURS} request B mean / last",
        f"{OURS_LEAN} request B mean / last",
        f"{PEER} response B mean",
        f"{OURS} response B mean",
        f"{OURS_LEAN} response B mean",
        "ratio (request, mean)",
        "ratio (request, lean)",
    ]
    return [
        "## Bytes per streaming-derender call",
        "",
        "Request and response body sizes of the streaming loop above over the first chunks of "
        "the output; `last` is the final call's request, which grows with the carried state.",
        "",
        *_table(header, rows),
        "",
    ]


Series = dict[str, list[tuple[float, float]]]


def draw_plots(results: Results, out_dir: Path, stem: str) -> list[Path]:
    """Three PNGs: stream CPU vs n (log-log), latency vs prompt length, throughput vs clients."""
    stream: Series = {}
    for s in results.stream_derender:
        if s.outcome.ok:
            stream.setdefault(s.system, []).append((s.n, s.server_cpu_s))
        elif s.outcome.status == SKIPPED and s.calls:
            stream.setdefault(f"{s.system} (cut at budget)", []).append((s.calls, s.server_cpu_s))
    latency: Series = {}
    for lat in results.render_latency:
        if lat.outcome.ok:
            key = f"{lat.system}{' + tools' if lat.tools else ''}"
            latency.setdefault(key, []).append((lat.prompt_tokens, lat.median_ms))
    rate: Series = {}
    for t in results.throughput:
        if t.outcome.ok:
            rate.setdefault(t.system, []).append((t.concurrency, t.requests_per_s))
    return [
        _plot(
            out_dir / f"{stem}-stream-cpu.png",
            "Streaming derender: server CPU per stream",
            ("one-token chunks (n)", "server CPU (s)"),
            stream,
            sorted({r.n for r in results.stream_derender}),
            log_y=True,
        ),
        _plot(
            out_dir / f"{stem}-render-latency.png",
            "Chat render latency vs prompt length",
            ("prompt tokens", "median latency (ms)"),
            latency,
            sorted({r.prompt_tokens for r in results.render_latency if not r.tools}),
            log_y=True,
        ),
        _plot(
            out_dir / f"{stem}-render-throughput.png",
            "Chat render throughput (~1k-token prompt)",
            ("concurrent clients", "requests / s"),
            rate,
            sorted({r.concurrency for r in results.throughput}),
            log_y=False,
        ),
    ]


def _plot(
    path: Path,
    title: str,
    labels: tuple[str, str],
    series: Series,
    xticks: list[int],
    log_y: bool,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for label, points in series.items():
        xs, ys = zip(*sorted(points), strict=True)
        cut = label.endswith("(cut at budget)")
        ax.plot(xs, ys, marker="x" if cut else "o", linestyle="none" if cut else "-", label=label)
    ax.set(xscale="log", yscale="log" if log_y else "linear", title=title)
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    if xticks:
        ax.set_xticks(xticks, labels=[f"{x:g}" for x in xticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        # Plain numbers (50, not 5x10^1), and only the 2x/5x minor ticks get a label.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
    if series:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _minor_label(value: float, _pos: int) -> str:
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value))
    return (
        f"{value:g}" if round(mantissa) in (2, 5) and abs(mantissa - round(mantissa)) < 1e-6 else ""
    )
