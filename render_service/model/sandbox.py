"""Per-request chat templates run in a small pool of child processes that can be killed.

A thread cannot be stopped, so a template that loops forever in the server's own process would
keep a worker thread busy for good (vLLM's render server has exactly this problem: its timeout
swaps the pool and leaves the thread spinning). Untrusted templates (``chat_template`` in the
request, allowed only with ``--trust-request-chat-template``) therefore render in a child
process (render_service.model._template_worker) that holds Jinja2's sandbox *and* an address-space cap.
On timeout the child is killed and replaced on next use; the request gets a 400 that names the
limit. The server's own template stays on the in-process fast path: the operator chose it, and
its input is bounded by the request limits.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import subprocess
import sys
import time
from typing import Any

import msgspec

from render_service.errors import InvalidRequest, TemplateLimit
from render_service.model._frames import read_frame, write_frame

__all__ = ["TemplateSandbox"]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict[str, Any])
# Starting a child imports the chat-template environment; that must not count against a template.
_STARTUP_TIMEOUT = 120.0
# Environment variables an operator may set with secrets (the state secret, vLLM's API key
# variable), and the one that points the server's workers at their settings file.
_SECRET_ENV = frozenset(
    {"RENDER_SERVICE_SETTINGS_FILE", "RENDER_SERVICE_STATE_SECRET", "VLLM_API_KEY"}
)


class _WorkerGone(Exception):
    """The child timed out, died or answered garbage: it must be killed and replaced."""


class _Worker:
    """One child process and its pipes; used by one thread at a time."""

    def __init__(self, memory_bytes: int) -> None:
        # A child runs untrusted templates: it gets no secrets, even though Jinja's sandbox
        # should keep a template from reading its environment at all.
        env = {k: v for k, v in os.environ.items() if k not in _SECRET_ENV}
        env["TOKENIZERS_PARALLELISM"] = "false"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "render_service.model._template_worker", str(memory_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        if self._read(time.monotonic() + _STARTUP_TIMEOUT) != {"ready": True}:
            self.kill()
            raise _WorkerGone

    def call(self, job: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.process.stdin is not None
        deadline = time.monotonic() + timeout
        try:
            write_frame(self.process.stdin, _encoder.encode(job))
        except (BrokenPipeError, OSError) as exc:
            raise _WorkerGone from exc
        return self._read(deadline)

    def _read(self, deadline: float) -> dict[str, Any]:
        stdout = self.process.stdout
        assert stdout is not None
        remaining = deadline - time.monotonic()
        # A reply is written in one flush after the render finishes, so once the first byte is
        # readable the rest follows at once: waiting for readability is the whole timeout.
        if remaining <= 0 or not select.select([stdout], [], [], remaining)[0]:
            raise _WorkerGone
        frame = read_frame(stdout)
        if frame is None:
            raise _WorkerGone
        try:
            return _decoder.decode(frame)
        except msgspec.DecodeError as exc:
            raise _WorkerGone from exc

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class TemplateSandbox:
    """Renders untrusted templates in up to ``workers`` children, with time/output/memory limits.

    Thread-safe: a caller borrows an idle child for one render. Children start lazily, so a server
    that never sees a per-request template never starts one.
    """

    def __init__(
        self, *, workers: int, timeout: float, max_output_chars: int, memory_bytes: int
    ) -> None:
        self.timeout = timeout
        self.max_output_chars = max_output_chars
        self.memory_bytes = memory_bytes
        self._idle: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()
        for _ in range(max(1, workers)):
            self._idle.put(None)

    def render(
        self,
        template: str,
        conversation: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        kwargs: dict[str, Any],
    ) -> str:
        """The rendered prompt, or TemplateLimit (400) naming the limit that stopped it."""
        job = {
            "template": template,
            "conversation": conversation,
            "tools": tools,
            "kwargs": kwargs,
            "max_chars": self.max_output_chars,
        }
        worker = self._idle.get()
        try:
            if worker is None or worker.process.poll() is not None:
                worker = _Worker(self.memory_bytes)
            reply = worker.call(job, self.timeout)
            if "fatal" in reply:  # the child is exiting; never hand it to another caller
                worker.kill()
                worker = None
        except _WorkerGone:
            if worker is not None:
                worker.kill()
            worker = None
            raise TemplateLimit(
                f"The chat template did not finish within {self.timeout} s (--template-timeout) "
                "or its worker exceeded --template-memory-bytes; it was stopped.",
                "chat_template",
            ) from None
        finally:
            self._idle.put(worker)
        if "text" in reply:
            return str(reply["text"])
        limit = reply.get("limit")
        if limit == "output":
            raise TemplateLimit(
                f"The chat template produced {reply.get('chars')} characters, over this server's "
                f"limit of {self.max_output_chars} (--max-template-output-chars).",
                "chat_template",
            )
        if limit == "memory":
            raise TemplateLimit(
                "The chat template allocated more than this server allows "
                "(--template-memory-bytes).",
                "chat_template",
            )
        if limit == "recursion":
            raise TemplateLimit("The chat template recursed too deeply.", "chat_template")
        raise InvalidRequest(str(reply.get("error")))

    def close(self) -> None:
        """Kill every idle child (busy ones are killed by their own timeout)."""
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                return
            if worker is not None:
                worker.kill()
