"""Child process that renders per-request (untrusted) chat templates for render_service.model.sandbox.

Run as ``python -m render_service.model._template_worker MEMORY_BYTES``. It reads length-prefixed msgpack
jobs on stdin and answers each with one frame on its private copy of stdout. Its address space is
capped, so a template that allocates without bound gets a MemoryError here rather than pressure on
the server; a template that loops forever is killed by the parent. Messages are msgpack, not
pickle, so even a template that escaped Jinja2's sandbox could not make the parent run code.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

import jinja2
import msgspec

from render_service.model._frames import read_frame, write_frame

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict[str, Any])
_MAX_MESSAGE_CHARS = 500


def _cap_memory(budget: int) -> None:
    """Allow ``budget`` bytes of address space beyond what the interpreter holds now."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[0])
    current = pages * os.sysconf("SC_PAGE_SIZE")
    limit = current + budget
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def render(job: dict[str, Any]) -> str:
    from render_service.model.chat_jinja import render_chat

    return render_chat(job["template"], job["conversation"], job["tools"], {}, job["kwargs"])


def main(argv: list[str]) -> None:
    # Keep fd 1 for frames only: anything a library prints goes to stderr instead.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    from render_service.model import chat_jinja  # noqa: F401  (import before the cap)

    _cap_memory(int(argv[0]))
    write_frame(out, _encoder.encode({"ready": True}))
    stdin = sys.stdin.buffer
    while (frame := read_frame(stdin)) is not None:
        job = _decoder.decode(frame)
        try:
            text = render(job)
            reply = (
                {"limit": "output", "chars": len(text)}
                if len(text) > job["max_chars"]
                else {"text": text}
            )
        except MemoryError:
            reply = {"limit": "memory", "fatal": True}
        except RecursionError:
            reply = {"limit": "recursion"}
        except jinja2.TemplateError as exc:  # as in-process: the template's own message
            reply = {"error": str(exc)[:_MAX_MESSAGE_CHARS]}
        # The outermost handler of this process: any template failure becomes a reply, not a crash.
        except Exception as exc:
            reply = {"error": f"chat template failed: {exc}"[:_MAX_MESSAGE_CHARS]}
        write_frame(out, _encoder.encode(reply))
        if "fatal" in reply:
            return


if __name__ == "__main__":
    main(sys.argv[1:])
