"""Micro-benchmark: cost of the stream_state envelope and of the parser cache's digests.

Prints medians over repeated runs: encode, decode and both for a representative state (a few
ints, ten ids, a short string; as a map and as an array_like Struct) and for one big enough to
be deflated; then the running digest per token and ``longest_prefix`` over long histories. Run from the repo root:

    PYTHONPATH=. python bench/state_bench.py [--repeat 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import msgspec

from render_service.derender.parser_cache import ParserCache, running_digest, seed_digest
from render_service.derender.stream_state import StateCodec, random_secret


class Sample(msgspec.Struct, frozen=True):
    phase: int
    offset: int
    tool_index: int
    read_offset: int
    window: tuple[int, ...]
    held: str


class SampleArray(Sample, frozen=True, array_like=True):
    """The same fields, encoded as a msgpack array (no field names on the wire)."""


def median_us(fn: Callable[[], object], repeat: int, inner: int = 1) -> float:
    """Median microseconds per call of ``fn`` (timed in batches of ``inner`` calls)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times) * 1e6


def bench_codec(repeat: int) -> None:
    codec = StateCodec(random_secret(), b"model=qwen3;parsers=qwen3+hermes")
    small = Sample(2, 1234, 1, 1230, tuple(range(151640, 151650)), "<tool_")
    big = msgspec.structs.replace(small, held='{"name": "get_weather", "arguments": ' * 20)
    print(f"{'state':<10}{'chars':>7}{'encode us':>12}{'decode us':>12}{'both us':>10}")
    small_array = SampleArray(*msgspec.structs.astuple(small))
    for name, value in (("small", small), ("array", small_array), ("deflated", big)):
        token = codec.encode(value)
        kind = type(value)
        enc = median_us(lambda v=value: codec.encode(v), repeat, 20)
        dec = median_us(lambda t=token, k=kind: codec.decode(t, k), repeat, 20)
        both = median_us(lambda v=value, k=kind: codec.decode(codec.encode(v), k), repeat, 20)
        print(f"{name:<10}{len(token):>7}{enc:>12.2f}{dec:>12.2f}{both:>10.2f}")


def bench_cache(repeat: int) -> None:
    seed = seed_digest(b"qwen3", b"qwen3+hermes", b"ctx", b"req", b"0")
    one = [151667]
    per_token = median_us(lambda: running_digest(seed, one), repeat, 50)
    print(f"\nrunning_digest, one token: {per_token:.2f} us")
    print(f"{'history':>8}{'longest_prefix ms':>19}{'per token us':>14}")
    for n in (1_024, 16_384):
        history = [(i * 7919) % 151_000 for i in range(n)]
        cache: ParserCache[int] = ParserCache(4096, 600.0)
        key = running_digest(seed, history[: n // 2])

        def lookup(
            cache: ParserCache[int] = cache, history: list[int] = history, key: bytes = key
        ) -> None:
            cache.check_in(key, 1)
            cache.longest_prefix(seed, history)

        ms = median_us(lookup, max(5, repeat // 100)) / 1000
        print(f"{n:>8}{ms:>19.2f}{ms * 1000 / n:>14.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    bench_codec(args.repeat)
    bench_cache(args.repeat)


if __name__ == "__main__":
    main()
