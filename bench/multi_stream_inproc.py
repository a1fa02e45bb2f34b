"""In-process profile of the multi-stream derender endpoint: the handler's own work per call.

Builds the app as a server worker does (qwen3 + hermes + qwen3 reasoning, a state secret), then
runs ``--streams`` streams of the bench's output (the ~1k chat with tools) for ``--steps`` engine
steps, one body per step, through what ``POST /v1/chat/completions/derender/streams`` does
between receiving the bytes and sending them: decode, limits, the derender call, metrics, encode.
No HTTP, no client in the same process's CPU: it prints process CPU per chunk of each step, and
the garbage collector's time (young and full collections) per repetition.

    PYTHONPATH=. python bench/multi_stream_inproc.py --streams 256 --steps 16 [--msgpack]
    PYTHONPATH=. python bench/multi_stream_inproc.py --profile   # cProfile of the measured steps

Run it with another checkout first on PYTHONPATH for an in-process A/B (alternate the two).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

import msgspec

from bench import measure
from bench.plan import QUICK, Inputs

_MODEL = "qwen3"


class _GcClock:
    """Seconds spent in young and in full collections since the last ``take``."""

    def __init__(self) -> None:
        self.young = self.full = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif info["generation"] == 2:
            self.full += time.perf_counter() - self._started
        else:
            self.young += time.perf_counter() - self._started

    def take(self) -> tuple[float, float]:
        taken = self.young, self.full
        self.young = self.full = 0.0
        return taken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="../shared/models/qwen3")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--steps", type=int, default=16, help="measured steps per repetition")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--msgpack", action="store_true", help="msgpack bodies both ways")
    parser.add_argument("--profile", action="store_true", help="cProfile the measured steps")
    args = parser.parse_args()

    from render_service.http import handlers, metrics
    from render_service.http.app import build_app
    from render_service.http.responses import MsgpackResponse, MsgspecResponse
    from render_service.render import Renderer
    from render_service.settings import Settings
    from render_service.validation import decode_body

    model = Path(args.model).resolve()
    settings = Settings(
        model=str(model),
        served_model_name=_MODEL,
        reasoning_parser="qwen3",
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        state_secret=secrets.token_hex(32),
    )
    service = build_app(Renderer.from_settings(settings)).state.service
    try:  # a worker's collector settings, where the checkout has them
        from render_service.http.server import tune_garbage_collection

        tune_garbage_collection()
    except ImportError:
        gc.collect()
    data = Inputs(model, QUICK)
    base = data.stream_base(QUICK.latency_sizes[0])
    ids = data.outputs[QUICK.stream_n[0]]
    if args.steps >= len(ids):
        raise SystemExit(f"--steps must be below {len(ids)}")
    content_type = handlers.MSGPACK if args.msgpack else handlers.JSON
    decoder = handlers._chat_streams_decoders[content_type]
    encode = msgspec.msgpack.encode if args.msgpack else msgspec.json.encode
    decode = msgspec.msgpack.decode if args.msgpack else msgspec.json.decode
    answer = MsgpackResponse if args.msgpack else MsgspecResponse
    limits, derenderer = service.limits, service.derenderer

    def call(body_bytes: bytes) -> bytes:
        body = decode_body(body_bytes, decoder)
        limits.check_request(body)
        result = derenderer.derender_chat_streams(body, limits.check_embedded, msgpack=args.msgpack)
        metrics.observe_derender(body, derenderer.cache)
        return bytes(answer(result).body)

    def run(tag: str, profile: cProfile.Profile | None = None) -> list[float]:
        """Process CPU per chunk (µs) of each measured step; step 0 (first calls) is not."""
        request_ids = [f"chatcmpl-inproc-{tag}-{k}" for k in range(args.streams)]
        states: list[Any] = [None] * args.streams
        first = {key: base[key] for key in ("prompt_token_ids", "chat_request")}
        per_chunk = []
        for step in range(args.steps + 1):
            inputs = first if step == 0 else {}
            items = [
                {
                    "generate_chunk": measure.generate_chunk(rid, [ids[step]], None),
                    "stream_state": states[k],
                    **inputs,
                }
                for k, rid in enumerate(request_ids)
            ]
            body = encode({"model": _MODEL, "items": items})
            if step and profile is not None:
                profile.enable()
            started = time.process_time()
            out = call(body)
            spent = time.process_time() - started
            if step and profile is not None:
                profile.disable()
            for k, item in enumerate(decode(out)["items"]):
                if item.get("error") is not None:
                    raise SystemExit(f"step {step}, stream {k}: {item['error']}")
                states[k] = item["stream_state"]
            if step:
                per_chunk.append(1e6 * spent / args.streams)
        return per_chunk

    run("warm")
    if args.profile:
        profile = cProfile.Profile()
        run("profile", profile)
        pstats.Stats(profile).sort_stats("tottime").print_stats(40)
        return 0
    clock = _GcClock()
    for rep in range(args.reps):
        per_chunk = run(f"rep{rep}")
        young, full = clock.take()
        steps = " ".join(f"{us:.0f}" for us in per_chunk)
        print(
            f"rep {rep + 1}: mean {statistics.fmean(per_chunk):.1f} us/chunk, median "
            f"{statistics.median(per_chunk):.1f}; gc {1e3 * young:.1f} ms young, "
            f"{1e3 * full:.1f} ms full; steps: {steps}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
