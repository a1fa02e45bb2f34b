"""--request-timeout and --header-timeout on one loop timer each (http.deadlines): each request
is cancelled at its own deadline and answered 408, requests that finish in time are never
touched, and a cancellation from elsewhere stays a cancellation."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest
from starlette.requests import Request
from starlette.responses import Response

from render_service.http.deadlines import Deadlines
from render_service.http.errors import guarded


def _request() -> Request:
    return Request(
        {"type": "http", "method": "POST", "path": "/x", "headers": [], "query_string": b""}
    )


def _status(response: Response) -> int:
    return response.status_code


def test_each_request_times_out_at_its_own_deadline() -> None:
    ended: dict[str, float] = {}

    async def stuck(request: Request) -> Response:
        await asyncio.sleep(3600)
        return Response()

    async def quick(request: Request) -> Response:
        await asyncio.sleep(0.01)
        return Response(b"ok")

    endpoint = guarded(stuck, timeout=0.2, api_key=None)
    fast = guarded(quick, timeout=0.2, api_key=None)

    async def timed(name: str, delay: float) -> Response:
        await asyncio.sleep(delay)
        response = await endpoint(_request())
        ended[name] = time.monotonic()
        return response

    async def scenario() -> tuple[list[Response], list[Response], float]:
        start = time.monotonic()
        slow = asyncio.gather(timed("first", 0.0), timed("second", 0.15))
        quick_ones = [await fast(_request()) for _ in range(5)]
        return list(await slow), quick_ones, start

    slow, quick_ones, start = asyncio.run(scenario())
    assert [_status(r) for r in slow] == [408, 408]
    error = msgspec.json.decode(slow[0].body)["error"]
    assert error["code"] == 408 and "--request-timeout" in error["message"]
    assert [_status(r) for r in quick_ones] == [200] * 5
    # The second started 0.15 s later and ends at its own deadline, not the first's.
    assert ended["first"] - start >= 0.199
    assert ended["second"] - start >= 0.349


def test_a_request_that_finished_is_not_cancelled_later() -> None:
    async def quick(request: Request) -> Response:
        return Response(b"ok")

    endpoint = guarded(quick, timeout=0.05, api_key=None)

    async def scenario() -> tuple[int, bool]:
        response = await endpoint(_request())
        await asyncio.sleep(0.15)  # the timer fires with nothing pending
        task = asyncio.current_task()
        assert task is not None
        return _status(response), task.cancelling() == 0

    assert asyncio.run(scenario()) == (200, True)


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def stuck(request: Request) -> Response:
        await asyncio.sleep(3600)
        return Response()

    endpoint = guarded(stuck, timeout=60, api_key=None)

    async def scenario() -> None:
        task = asyncio.ensure_future(endpoint(_request()))
        await asyncio.sleep(0.01)
        task.cancel()
        await task

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario())


def test_one_timer_serves_many_deadlines_each_at_its_time() -> None:
    async def scenario() -> tuple[int, list[tuple[str, float]]]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines.of(None, 0.1)
        assert Deadlines.of(deadlines, 0.1) is deadlines
        assert Deadlines.of(deadlines, 0.2) is not deadlines
        fired: list[tuple[str, float]] = []
        timers = set()
        for _ in range(100):  # started and stopped in time: one timer, never fired
            key = deadlines.start(lambda: fired.append(("stopped", loop.time())))
            timers.add(id(deadlines._timer))
            assert deadlines.stop(key)
        start = loop.time()
        first = deadlines.start(lambda: fired.append(("first", loop.time() - start)))
        await asyncio.sleep(0.05)
        deadlines.start(lambda: fired.append(("second", loop.time() - start)))
        await asyncio.sleep(0.3)
        assert not deadlines.stop(first)  # it ran
        return len(timers), fired

    timers, fired = asyncio.run(scenario())
    assert timers == 1
    assert [name for name, _ in fired] == ["first", "second"]
    # Each at its own deadline (never before it; how late depends on the machine).
    assert fired[0][1] >= 0.099 and fired[1][1] >= 0.149
