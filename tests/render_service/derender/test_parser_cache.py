"""The prefix-keyed parser cache: check-out semantics, LRU and TTL, longest prefix, digests."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from render_service.derender.parser_cache import (
    CacheStats,
    ParserCache,
    running_digest,
    seed_digest,
)

SEED = seed_digest(b"qwen3", b"qwen3+hermes", b"ctx", b"req-1", b"0")
OTHER_SEED = seed_digest(b"qwen3", b"qwen3+hermes", b"ctx", b"req-2", b"0")
HISTORY = [151667, 40, 1184, 311, 1744, 151668, 271, 9707, 0, 4294967295]

ids = st.lists(st.integers(0, 2**32 - 1), max_size=40)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(max_entries: int = 8, ttl: float = 60.0) -> tuple[ParserCache[str], FakeClock]:
    clock = FakeClock()
    return ParserCache[str](max_entries, ttl, clock), clock


def key(n: int, seed: bytes = SEED) -> bytes:
    return running_digest(seed, HISTORY[:n])


def test_hit_and_miss() -> None:
    cache, _ = make()
    assert cache.check_out(key(1)) is None
    cache.check_in(key(1), "one")
    assert cache.check_out(key(2)) is None
    assert cache.check_out(key(1)) == "one"
    assert cache.stats() == CacheStats(hits=1, misses=2, evictions=0, expirations=0, size=0)


def test_check_out_removes() -> None:
    cache, _ = make()
    cache.check_in(key(3), "three")
    assert cache.stats().size == 1
    assert cache.check_out(key(3)) == "three"
    assert cache.check_out(key(3)) is None
    cache.check_in(key(3), "three again")
    assert cache.check_out(key(3)) == "three again"


def test_check_in_replaces() -> None:
    cache, _ = make()
    cache.check_in(key(1), "old")
    cache.check_in(key(1), "new")
    assert cache.stats().size == 1
    assert cache.check_out(key(1)) == "new"


def test_lru_evicts_least_recently_checked_in() -> None:
    cache, _ = make(max_entries=3)
    for n in (1, 2, 3):
        cache.check_in(key(n), str(n))
    cache.check_in(key(1), "1 again")  # now the most recent
    cache.check_in(key(4), "4")  # evicts 2
    cache.check_in(key(5), "5")  # evicts 3
    assert cache.stats().evictions == 2
    assert cache.check_out(key(2)) is None
    assert cache.check_out(key(3)) is None
    assert [cache.check_out(key(n)) for n in (1, 4, 5)] == ["1 again", "4", "5"]


def test_check_in_many_is_check_in_of_each_in_order() -> None:
    entries = [(key(n % 5), f"v{n}", 10 * n) for n in range(12)]
    one, one_clock = make(max_entries=3)
    many, many_clock = make(max_entries=3)
    one.max_bytes = many.max_bytes = 150
    for entry in entries:
        one.check_in(*entry)
    many.check_in_many(entries)
    assert one.stats() == many.stats()
    assert [one.check_out(key(n)) for n in range(5)] == [many.check_out(key(n)) for n in range(5)]
    assert one_clock.now == many_clock.now


def test_zero_entries_disables() -> None:
    cache, _ = make(max_entries=0)
    cache.check_in(key(1), "one")
    assert cache.check_out(key(1)) is None
    assert cache.stats().size == 0


def test_ttl_expiry() -> None:
    cache, clock = make(ttl=10.0)
    cache.check_in(key(1), "one")
    cache.check_in(key(2), "two")
    clock.now += 9.5
    assert cache.check_out(key(1)) == "one"
    clock.now += 0.5
    assert cache.check_out(key(2)) is None
    assert cache.stats() == CacheStats(hits=1, misses=1, evictions=0, expirations=1, size=0)


def test_check_in_restarts_the_ttl() -> None:
    cache, clock = make(ttl=10.0)
    cache.check_in(key(1), "one")
    clock.now += 8
    cache.check_in(key(1), "one, later")
    clock.now += 8
    assert cache.check_out(key(1)) == "one, later"


def test_check_in_sweeps_expired_entries_in_bounded_steps() -> None:
    cache, clock = make(max_entries=100, ttl=10.0)
    for n in range(20):
        cache.check_in(running_digest(SEED, [n]), "stale")
    clock.now += 10
    cache.check_in(running_digest(SEED, [1000]), "fresh")
    first = cache.stats()
    assert 0 < first.expirations < 20
    assert first.size == 21 - first.expirations
    for n in range(1001, 1020):
        cache.check_in(running_digest(SEED, [n]), "fresh")
    stats = cache.stats()
    assert stats.expirations == 20
    assert stats.size == 20
    assert stats.evictions == 0


def test_longest_prefix_takes_the_longest_cached_position() -> None:
    cache, _ = make()
    cache.check_in(key(3), "at 3")
    cache.check_in(key(7), "at 7")
    cache.check_in(key(9, OTHER_SEED), "other stream at 9")
    cache.check_in(running_digest(SEED, [*HISTORY[:8], 5]), "diverged at 9")
    assert cache.longest_prefix(SEED, HISTORY) == (7, "at 7")
    assert cache.longest_prefix(SEED, HISTORY) == (3, "at 3")
    assert cache.longest_prefix(SEED, HISTORY) is None
    assert cache.check_out(key(9, OTHER_SEED)) == "other stream at 9"
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.size) == (3, 1, 1)


def test_longest_prefix_ignores_positions_beyond_the_history() -> None:
    cache, _ = make()
    cache.check_in(key(2), "at 2")
    cache.check_in(key(9), "at 9")
    assert cache.longest_prefix(SEED, HISTORY[:8]) == (2, "at 2")


def test_longest_prefix_at_the_seed_and_with_empty_history() -> None:
    cache, _ = make()
    cache.check_in(SEED, "start")
    assert cache.longest_prefix(SEED, []) == (0, "start")
    cache.check_in(SEED, "start")
    assert cache.longest_prefix(SEED, HISTORY) == (0, "start")


def test_longest_prefix_skips_an_expired_longer_entry() -> None:
    cache, clock = make(ttl=10.0)
    cache.check_in(key(8), "old at 8")
    clock.now += 6
    cache.check_in(key(4), "at 4")
    clock.now += 6
    assert cache.longest_prefix(SEED, HISTORY) == (4, "at 4")
    assert cache.stats().expirations == 1


@given(ids, st.lists(st.integers(0, 40), max_size=6))
def test_digest_does_not_depend_on_chunking(token_ids: list[int], cuts: list[int]) -> None:
    bounds = [0, *sorted(min(c, len(token_ids)) for c in cuts), len(token_ids)]
    digest = SEED
    for lo, hi in pairwise(bounds):
        digest = running_digest(digest, token_ids[lo:hi])
    assert digest == running_digest(SEED, token_ids)


@given(ids, ids)
def test_digest_tells_histories_apart(a: list[int], b: list[int]) -> None:
    assert (running_digest(SEED, a) == running_digest(SEED, b)) == (a == b)


def test_digest_depends_on_seed_and_order() -> None:
    assert running_digest(SEED, [1, 2]) != running_digest(SEED, [2, 1])
    assert running_digest(SEED, [1]) != running_digest(OTHER_SEED, [1])
    assert running_digest(SEED, []) == SEED
    assert len(SEED) == len(running_digest(SEED, [1])) == 16


def test_seed_parts_do_not_blur() -> None:
    assert seed_digest(b"ab", b"c") != seed_digest(b"a", b"bc")
    assert seed_digest(b"a", b"") != seed_digest(b"a")
    assert seed_digest(b"a", b"b") == seed_digest(b"a", b"b")


@pytest.mark.parametrize("bad", [-1, 2**32, 2**40])
def test_ids_out_of_range_are_a_value_error(bad: int) -> None:
    with pytest.raises(ValueError, match=str(bad)):
        running_digest(SEED, [1, bad, 2])
    cache, _ = make()
    with pytest.raises(ValueError, match=str(bad)):
        cache.longest_prefix(SEED, [1, bad])


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        ParserCache[str](-1, 1.0)
    with pytest.raises(ValueError, match="ttl"):
        ParserCache[str](1, 0.0)


def test_concurrent_check_out_gives_the_value_to_exactly_one() -> None:
    threads = 8
    cache: ParserCache[object] = ParserCache(16, 60.0)
    barrier = threading.Barrier(threads)

    def grab(k: bytes) -> object | None:
        barrier.wait()
        return cache.check_out(k)

    with ThreadPoolExecutor(threads) as pool:
        for round_ in range(50):
            k = running_digest(SEED, [round_])
            token = object()
            cache.check_in(k, token)
            got = list(pool.map(grab, [k] * threads))
            assert [g for g in got if g is not None] == [token]
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.size) == (50, 50 * (threads - 1), 0)
