"""Helpers of the workloads: stream-time extrapolation and percentiles."""

from __future__ import annotations

import pytest

from bench.measure import multi_steps, percentile, predicted_stream_s


def test_flat_per_call_cost_extrapolates_linearly() -> None:
    calls = [0.002] * 256
    assert predicted_stream_s([(256, sum(calls))], calls, 1024) == pytest.approx(0.002 * 1024)


def test_growing_per_call_cost_extrapolates_quadratically() -> None:
    base, slope = 0.001, 0.0001
    calls = [base + slope * i for i in range(256)]
    n = 1024
    exact = sum(base + slope * i for i in range(n))
    assert predicted_stream_s([(256, sum(calls))], calls, n) == pytest.approx(exact, rel=0.01)


def test_two_runs_give_a_power_law() -> None:
    history = [(256, 2.0), (1024, 2.0 * 4**1.5)]
    assert predicted_stream_s(history, [], 4096) == pytest.approx(2.0 * 16**1.5)


def test_nothing_to_go_on() -> None:
    assert predicted_stream_s([], [], 256) is None


def test_p99_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 99) == 99.0
    assert percentile(values[:20], 99) == 20.0
    assert percentile([5.0], 50) == 5.0


def test_multi_steps_reach_the_chunk_count_within_the_output() -> None:
    assert multi_steps(256, 4096, 256) == 16
    assert multi_steps(64, 4096, 256) == 64
    assert multi_steps(16, 4096, 256) == 255  # the first of 256 ids is not measured
    assert multi_steps(256, 4096, 256, least=32) == 32
    assert multi_steps(100, 1000, 256) == 10  # rounded up
