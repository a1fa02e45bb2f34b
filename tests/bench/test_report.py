"""The report generator on a small synthetic run: no servers, no timing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the bench extra (matplotlib) is not installed")

from bench import report
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
    Meta,
    MultiStreamRow,
    MultiTurnRow,
    NoiseRow,
    Outcome,
    Results,
    StreamRow,
    ThroughputRow,
    decode,
)

LEAN_MISSING = Outcome(NOT_IMPLEMENTED, "lean body rejected: call 2: HTTP 400 synthetic")
TOO_SLOW = Outcome(SKIPPED, "not run: synthetic budget")
CUT = Outcome(SKIPPED, "cut at the synthetic budget")


def synthetic() -> Results:
    meta = Meta(
        started_utc="2026-01-01T00:00:00+00:00",
        finished_utc="2026-01-01T00:01:00+00:00",
        quick=True,
        model="/models/qwen3",
        parser_flags=["--reasoning-parser", "qwen3"],
        machine="2 cores, test",
        commands={PEER: "vllm launch render qwen3", OURS: "python -m render_service serve qwen3"},
        system_notes={},
        settings={"latency_reps": "4"},
        load_average={"start": "0.10 0.20 0.30", "end": "0.40 0.50 0.60"},
    )
    return Results(
        meta=meta,
        render_latency=[
            LatencyRow(PEER, "1k", False, 1001, Outcome(), 4, 8.0, 11.0, 7.5),
            LatencyRow(OURS, "1k", False, 1001, Outcome(), 4, 2.5, 3.0, 2.0),
            LatencyRow(PEER, "9k", True, 9300, Outcome(), 4, 30.0, 33.0, 29.0),
            LatencyRow(OURS, "9k", True, 9300, Outcome(NOT_IMPLEMENTED, "HTTP 404 synthetic")),
        ],
        latency_noise=[
            NoiseRow(PEER, "render 1k chat, median latency", "ms", Outcome(), [8.0, 9.0, 10.0]),
            NoiseRow(OURS, "render 1k chat, median latency", "ms", Outcome(), [2.0, 2.1, 2.2]),
        ],
        throughput=[
            ThroughputRow(PEER, 1, 1001, Outcome(), 300, 2.0, 150.0, 1.8, 0.1),
            ThroughputRow(OURS, 1, 1001, Outcome(), 900, 2.0, 450.0, 1.7, 0.2),
            ThroughputRow(PEER, 4, 1001, Outcome(), 400, 2.0, 200.0, 1.9, 0.1),
            ThroughputRow(OURS, 4, 1001, Outcome(), 1600, 2.0, 800.0, 1.9, 0.3),
        ],
        stream_derender=[
            StreamRow(PEER, 256, Outcome(), 256, 3.0, 2.0, None, "peer summary 256"),
            StreamRow(PEER, 1024, Outcome(), 1024, 40.0, 2.0 * 4**3, None, "peer summary 1024"),
            StreamRow(PEER, 4096, CUT, 3000, 600.0, 450.0),
            StreamRow(PEER, 16384, TOO_SLOW),
            StreamRow(OURS, 256, Outcome(), 256, 0.5, 0.25, True, "ours summary 256"),
            StreamRow(OURS, 1024, Outcome(), 1024, 2.0, 1.0, False, "ours summary 1024"),
            StreamRow(OURS, 4096, Outcome(), 4096, 8.0, 4.0, None, "ours summary 4096"),
            StreamRow(OURS_LEAN, 256, LEAN_MISSING),
            StreamRow(OURS_LEAN, 1024, LEAN_MISSING),
            StreamRow(OURS_LEAN, 4096, LEAN_MISSING),
        ],
        batch_derender=[
            BatchRow(PEER, 256, Outcome(), 5, 9.0, 8.0),
            BatchRow(OURS, 256, Outcome(), 5, 3.0, 2.0),
        ],
        bytes_per_chunk=[
            BytesRow(PEER, 1328, Outcome(), 32, 14000.0, 14100, 800.0, 801),
            BytesRow(OURS, 1328, Outcome(), 32, 7000.0, 7100, 700.0, 701),
            BytesRow(OURS_LEAN, 1328, LEAN_MISSING),
        ],
        multi_stream=[
            MultiStreamRow(PEER, 16, Outcome(), 8, 128, 2.0, 0.64),
            MultiStreamRow(OURS_ONE_BY_ONE, 16, Outcome(), 8, 128, 0.5, 0.064),
            MultiStreamRow(OURS, 16, Outcome(), 8, 128, 0.05, 0.0064),
            MultiStreamRow(OURS_MSGPACK, 16, CUT, 4, 64, 0.02, 0.0032),
        ],
        multi_turn=[
            MultiTurnRow(PEER, 20, 4000, Outcome(), 6, 12.0, 12.5, True),
            MultiTurnRow(OURS, 20, 4000, Outcome(), 6, 1.0, 4.0, True),
        ],
    )


def _row_of(markdown: str, first_cell: str, after: str) -> list[str]:
    """The cells of the first table row starting with `first_cell` below the heading `after`."""
    section = markdown[markdown.index(after) :]
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} under {after!r}")


def test_writes_all_files(tmp_path: Path) -> None:
    results = synthetic()
    written = report.write(results, tmp_path, "2026-01-01-test")
    names = {path.name for path in written}
    assert names == {
        "2026-01-01-test.md",
        "2026-01-01-test.json",
        "2026-01-01-test-stream-cpu.png",
        "2026-01-01-test-render-latency.png",
        "2026-01-01-test-render-throughput.png",
        "index.md",
    }
    for path in written:
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert decode((tmp_path / "2026-01-01-test.json").read_bytes()) == results
    assert json.loads((tmp_path / "2026-01-01-test.json").read_text())["meta"]["quick"] is True
    assert "[2026-01-01-test](2026-01-01-test.md)" in (tmp_path / "index.md").read_text()


def test_tables_show_input_numbers_and_ratios() -> None:
    results = synthetic()
    text = report.render_markdown(results, "raw.json", [])
    peer, ours = results.render_latency[0], results.render_latency[1]
    cells = _row_of(text, "1k", "## Render latency")
    assert cells[1] == str(peer.prompt_tokens)
    assert cells[2] == f"{peer.median_ms:.2f} / {peer.p99_ms:.2f}"
    assert cells[3] == f"{ours.median_ms:.2f} / {ours.p99_ms:.2f}"
    assert cells[4] == f"{peer.median_ms / ours.median_ms:.2f}×"

    rate = _row_of(text, "4", "## Render throughput")
    assert rate[3] == f"{800.0 / 200.0:.2f}×"

    stream = _row_of(text, "1024", "## Streaming derender")
    assert stream[3] == f"{(2.0 * 4**3) / 1.0:.0f}×"
    assert stream[6] == "NO / –"


def test_unimplemented_and_skipped_rows_stay_visible() -> None:
    text = report.render_markdown(synthetic(), "raw.json", [])
    cells = _row_of(text, "9k + tools", "## Render latency")
    assert cells[3].startswith(NOT_IMPLEMENTED)
    assert cells[4] == "–"
    assert "HTTP 404 synthetic" in text
    assert "lean body rejected" in text
    stream = _row_of(text, "16384", "## Streaming derender")
    assert stream[1].startswith(SKIPPED)
    assert "synthetic budget" in text
    cut = _row_of(text, "4096", "## Streaming derender")
    assert cut[1].startswith(SKIPPED)
    assert "450.0 / 600 for the first 3000 calls" in cut[1]
    for summary in ("peer summary 1024", "ours summary 4096"):
        assert summary in text


def test_noise_and_growth_are_computed_from_rows() -> None:
    results = synthetic()
    peer_noise = results.latency_noise[0]
    assert peer_noise.spread_pct == pytest.approx(100 * (10.0 - 8.0) / 9.0)
    text = report.render_markdown(results, "raw.json", [])
    assert f"{peer_noise.spread_pct:.1f} %" in text
    assert "0.10 0.20 0.30" in text
    slopes = report.growth_exponents(results.stream_derender, PEER)
    assert slopes == [(256, 1024, pytest.approx(math.log(4**3) / math.log(4)))]
    assert "n^3.00" in text
    assert report.growth_exponents(results.stream_derender, OURS_LEAN) == []


def test_multi_turn_table_compares_the_last_turn_warm_and_cold() -> None:
    text = report.render_markdown(synthetic(), "raw.json", [])
    assert _row_of(text, "turn 20 after turns 1-19", "## Multi-turn render") == [
        "turn 20 after turns 1-19",
        "12.00",
        "1.00",
        "12×",
    ]
    cold = _row_of(text, "turn 20 cold (its conversation's first request)", "## Multi-turn")
    assert cold[1:] == ["12.50", "4.00", "3.12×"]
    assert _row_of(text, "after ÷ cold", "## Multi-turn render")[1:3] == ["0.96", "0.25"]
    assert "(vLLM / ours): yes / yes" in text


def test_multi_stream_table_is_per_chunk_with_ratios_to_vllm() -> None:
    text = report.render_markdown(synthetic(), "raw.json", [])
    cells = _row_of(text, "16", "## Multi-stream derender")
    assert cells[1] == "5000"  # 0.64 s / 128 chunks
    assert cells[2:4] == ["500", "10×"]
    assert cells[4:6] == ["50", "100×"]
    assert cells[6].startswith(SKIPPED)
    assert cells[6].endswith(": 50 over the first 4 steps")  # a cut run's chunks still count
    assert cells[7] == "100×"
