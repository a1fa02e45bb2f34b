"""What hardening costs on the normal path: template in-process vs in the sandbox child, the
request-limit checks, and the server template's worst case at the default limits.

    PYTHONPATH=. python bench/sandbox_bench.py [MODEL_DIR]   (default ../shared/models/qwen3)
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from render_service import Renderer
from render_service.http.limits import Limits
from render_service.model.sandbox import TemplateSandbox
from render_service.model.templating import apply_template, build_conversation
from render_service.protocol.chat import ChatCompletionRequest

REPO = Path(__file__).resolve().parents[1]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        },
    },
}


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    model = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / ".." / "shared" / "models" / "qwen3"
    renderer = Renderer.from_pretrained(str(model))
    tok = renderer.model.hf_tokenizer
    template = renderer.model.info.chat_template
    sandbox = TemplateSandbox(
        workers=1, timeout=30, max_output_chars=64 * 2**20, memory_bytes=1024 * 2**20
    )
    limits = Limits()
    rows = []
    for label, messages, tools in (
        ("1 message", [{"role": "user", "content": "Hello there!"}], None),
        (
            "8 messages + 4 tools",
            [
                {"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 50}
                for i in range(8)
            ],
            [TOOL] * 4,
        ),
        (
            "2048 messages + 256 tools (default limits)",
            [
                {"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 20}
                for i in range(2048)
            ],
            [TOOL] * 256,
        ),
    ):
        conversation = build_conversation(messages, "string", False)
        kwargs = {"add_generation_prompt": True}
        request = msgspec.convert({"messages": messages, "tools": tools}, ChatCompletionRequest)
        repeat = 5 if len(messages) > 100 else 50
        sandbox.render(template, conversation, tools, {**tok.special_tokens_map, **kwargs})  # warm
        rows.append(
            (
                label,
                median_ms(
                    partial(apply_template, tok, template, conversation, tools, kwargs), repeat
                ),
                median_ms(
                    partial(apply_template, tok, template, conversation, tools, kwargs, sandbox),
                    repeat,
                ),
                median_ms(partial(limits.check_request, request), repeat),
            )
        )
    sandbox.close()
    print(f"model: {model.name}")
    print("| request | template in-process ms | template in sandbox ms | limit checks ms |")
    print("|---|---:|---:|---:|")
    for label, local, boxed, checks in rows:
        print(f"| {label} | {local:.2f} | {boxed:.2f} | {checks:.3f} |")


if __name__ == "__main__":
    main()
