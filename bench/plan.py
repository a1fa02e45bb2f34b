"""What the bench sends: the size of each workload (quick or full) and the inputs built once."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import msgspec

from bench import inputs, measure

_TAG = "@@bench-request-tag@@"


class Plan(msgspec.Struct, frozen=True):
    """How much of each workload to run; --quick picks the small plan."""

    latency_sizes: tuple[int, ...] = (1000, 9000, 32000)
    latency_reps: int = 100
    warmup: int = 3
    noise_rounds: int = 3
    concurrency: tuple[int, ...] = (1, 4, 16, 64)
    throughput_s: float = 5.0
    throughput_max_requests: int = 20000
    stream_n: tuple[int, ...] = (256, 1024, 4096, 16384)
    ours_only_n: int = 16384
    stream_budget_s: float = 600.0
    batch_reps: int = 20
    bytes_prompts: tuple[int, ...] = (1000, 32000)
    bytes_chunks: int = 128
    multi_streams: tuple[int, ...] = (16, 64, 256)
    multi_steps: int = 32
    #: Chunks each one-call-per-step row measures at least (more steps for fewer streams).
    multi_chunks: int = 4096
    multi_turns: int = 20
    multi_turn_conversations: int = 20


FULL = Plan()
QUICK = Plan(
    latency_reps=20,
    warmup=2,
    throughput_s=1.5,
    stream_n=(256, 1024),
    stream_budget_s=45.0,
    batch_reps=5,
    bytes_chunks=32,
    multi_steps=8,
    multi_turn_conversations=6,
)


def label(tokens: int) -> str:
    return f"{tokens // 1000}k"


class Progress:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)


class Inputs:
    """Everything sent to the servers, built once from the model's tokenizer."""

    def __init__(self, model_dir: Path, plan: Plan):
        tok = inputs.Tokenizer(model_dir)
        self.model = model_dir.name
        sizes = sorted({*plan.latency_sizes, *plan.bytes_prompts})
        self.messages = {size: inputs.chat_messages(tok, size) for size in sizes}
        self.prompt_ids = {
            (size, tools): tok.chat_ids(self.messages[size], inputs.TOOLS if tools else None)
            for size in sizes
            for tools in (False, True)
        }
        self.outputs = {n: inputs.output_ids(tok, n) for n in plan.stream_n}
        self.multi_turns = plan.multi_turns
        last = inputs.conversation(plan.multi_turns, 0)[-1]
        self.multi_turn_ids = tok.chat_ids(last, inputs.TOOLS)
        # One counter for the whole run, so no two render requests are the same.
        self._serial = itertools.count()

    def render_body(self, size: int, tools: bool) -> bytes:
        return msgspec.json.encode(inputs.chat_request(self.model, self.messages[size], tools))

    def render_bodies(self, size: int, tools: bool) -> measure.Bodies:
        """Each body ends its last user message with a new tag: real traffic does not repeat a
        whole prompt, so a server-side cache of whole messages must not hit on every call."""
        messages = [*self.messages[size][:-1], dict(self.messages[size][-1])]
        messages[-1]["content"] += _TAG
        head, tail = msgspec.json.encode(inputs.chat_request(self.model, messages, tools)).split(
            _TAG.encode()
        )
        return lambda: b"%s (ref %d)%s" % (head, next(self._serial), tail)

    def conversation_bodies(self, fresh: bool) -> list[bytes]:
        """A conversation's bodies, one per turn, with tools: a new conversation (never sent
        before in this run) or the first one (whose last turn ``multi_turn_ids`` holds)."""
        seed = next(self._serial) + 1 if fresh else 0
        return [
            msgspec.json.encode(inputs.chat_request(self.model, messages, True))
            for messages in inputs.conversation(self.multi_turns, seed)
        ]

    def stream_base(self, size: int) -> dict[str, Any]:
        ids = self.prompt_ids[(size, True)]
        return {
            "model": self.model,
            "prompt_tokens": len(ids),
            "prompt_token_ids": ids,
            "chat_request": inputs.chat_request(self.model, self.messages[size], True, stream=True),
        }

    def batch_body(self, size: int, n: int) -> bytes:
        ids = self.prompt_ids[(size, True)]
        return msgspec.json.encode(
            {
                "model": self.model,
                "generate_response": measure.generate_response(
                    f"generate-tokens-chatcmpl-bench-batch-{n}",
                    self.model,
                    len(ids),
                    self.outputs[n],
                ),
                "prompt_tokens": len(ids),
                "prompt_token_ids": ids,
                "chat_request": inputs.chat_request(self.model, self.messages[size], True),
            }
        )
