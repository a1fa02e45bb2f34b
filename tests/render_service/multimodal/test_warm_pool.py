"""The media thread pool: last-idle-first dispatch, a backlog when all are busy, shutdown."""

from __future__ import annotations

import asyncio
import threading

import pytest

from render_service.multimodal.warm_pool import WarmThreadPool


def test_results_and_exceptions_come_back() -> None:
    pool = WarmThreadPool(2, "t")
    assert pool.submit(lambda a, b=0: a + b, 2, b=3).result(timeout=5) == 5
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=5)
    pool.shutdown()


def test_one_job_at_a_time_stays_on_one_thread() -> None:
    pool = WarmThreadPool(3, "t")
    names = {
        pool.submit(lambda: threading.current_thread().name).result(timeout=5) for _ in range(30)
    }
    pool.shutdown()
    assert len(names) == 1


def test_jobs_beyond_the_threads_wait_and_all_run() -> None:
    pool = WarmThreadPool(2, "t")
    gate = threading.Event()
    blocked = [pool.submit(gate.wait, 5) for _ in range(2)]
    queued = [pool.submit(lambda i=i: i * i) for i in range(20)]
    assert not any(f.done() for f in queued)
    gate.set()
    assert [f.result(timeout=5) for f in queued] == [i * i for i in range(20)]
    assert all(f.result(timeout=5) for f in blocked)
    pool.shutdown()


def test_shutdown_runs_the_backlog_or_cancels_it() -> None:
    for cancel in (False, True):
        pool = WarmThreadPool(1, "t")
        gate = threading.Event()
        running = pool.submit(gate.wait, 5)
        waiting = pool.submit(lambda: "ran")
        pool.shutdown(wait=False, cancel_futures=cancel)
        gate.set()
        pool.shutdown()  # waits for the threads
        assert running.result() is True
        assert waiting.cancelled() if cancel else waiting.result() == "ran"
        with pytest.raises(RuntimeError):
            pool.submit(lambda: None)


def test_a_failing_initializer_leaves_the_thread_serving() -> None:
    def broken() -> None:
        raise OSError("no priority change allowed")

    pool = WarmThreadPool(1, "t", broken)
    assert pool.submit(lambda: 7).result(timeout=5) == 7
    pool.shutdown()


def test_the_event_loop_can_use_it() -> None:
    pool = WarmThreadPool(2, "t")

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        return list(await asyncio.gather(*(loop.run_in_executor(pool, abs, -i) for i in range(8))))

    assert asyncio.run(main()) == list(range(8))
    pool.shutdown()
