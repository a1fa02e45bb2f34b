"""Run the commands a document shows, as a reader would, so that the docs stay true.

A document's ```bash blocks run in order with ``bash`` in the repository root; a block whose
last step starts a server (``render-service serve`` or ``examples/fake_engine.py``, with or
without a trailing ``&``) runs in the background until every block is done, and the next block
starts once the server answers ``GET /health``.
A ```python block runs with the environment's Python. A ```text block right after a command is
what the command prints (stdout and stderr together); a line ending in ``...`` matches any line
with that start. A command with no text block fails if it prints an error body (``{"error":``).

What a reader's machine has and this one may not is swapped in: the ports 8000 to 8003 become free
ones, ``/models/Qwen3-8B`` and ``/models/gpt-oss-20b`` become ../shared/models/qwen3 and gpt-oss (a
block naming one is skipped where ../shared is absent). With ``installed=True`` (inside the test
suite) ``.venv/bin/`` is the running environment's and the install steps of a command (``python3 -m
venv``, ``pip install``) are left out: the newcomer run in .ci/run runs them (``python3
tests/doc_commands.py README.md``).

Standard library only: the newcomer run starts it before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_MODELS = REPO.parent / "shared" / "models"
# The model paths the docs show, and the shared models standing in for them.
MODELS = {
    "/models/Qwen3-8B": SHARED_MODELS / "qwen3",
    "/models/gpt-oss-20b": SHARED_MODELS / "gpt-oss",
}
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
# A command whose last step starts a server (a trailing "&" is the reader's way of saying so).
_SERVER = re.compile(r"(render-service serve|examples/fake_engine\.py)[^|;&]*&?\s*$")
_INSTALL = re.compile(r"^(python3 -m venv \S+|\S*pip install .*)$")


@dataclass
class Block:
    lang: str
    code: str
    expected: str | None
    line: int

    def __str__(self) -> str:
        return f"line {self.line}: {self.code.strip()}"


@dataclass
class Outcome:
    block: Block
    ran: bool
    reason: str = ""


def blocks(path: Path) -> list[Block]:
    """The bash and python blocks of a Markdown file, each with the text block after it."""
    text = path.read_text(encoding="utf-8")
    found = [
        (m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1, m.end())
        for m in _FENCE.finditer(text)
    ]
    out: list[Block] = []
    for i, (lang, code, line, end) in enumerate(found):
        if lang not in ("bash", "python"):
            continue
        expected = None
        if i + 1 < len(found) and found[i + 1][0] == "text":
            between = text[end : text.index("```text", end)]
            if not between.strip() or between.strip().endswith(":"):
                expected = found[i + 1][1]
        out.append(Block(lang, code, expected, line))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Reader:
    """Runs a document's blocks with the swaps above; servers stop when the reader does."""

    def __init__(self, installed: bool, workdir: Path, bin_dir: Path | None = None) -> None:
        self.installed = installed
        self.bin_dir = bin_dir or Path(sys.executable).parent
        self.workdir = workdir
        self.ports = {p: str(free_port()) for p in ("8000", "8001", "8002", "8003")}
        self.stack = ExitStack()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stack.close()

    def swap_ports(self, text: str) -> str:
        for port, free in self.ports.items():
            text = re.sub(rf"\b{port}\b", free, text)
        return text

    def prepare(self, block: Block) -> str | None:
        """The block as it runs here, or None when it needs what this machine lacks. Paths put
        into a bash block are quoted: the checkout's may contain spaces."""
        code = block.code
        path = shlex.quote if block.lang == "bash" else str
        for shown, here in MODELS.items():
            if shown in code:
                if not here.is_dir():
                    return None
                code = code.replace(shown, path(str(here)))
        code = self.swap_ports(code)
        if self.installed:
            lines = []
            for line in code.split("\n"):
                steps = [s for s in line.split(" && ") if not _INSTALL.match(s.strip())]
                lines.append(" && ".join(steps))
            code = "\n".join(lines).replace(".venv/bin/", f"{path(str(self.bin_dir))}/")
        return code

    def run(self, block: Block) -> Outcome:
        code = self.prepare(block)
        if code is None:
            return Outcome(block, False, f"needs {SHARED_MODELS}, which is absent here")
        if block.lang == "python":
            script = self.workdir / f"block-{block.line}.py"
            script.write_text(code, encoding="utf-8")
            venv_python = REPO / ".venv" / "bin" / "python"
            python = venv_python if not self.installed and venv_python.exists() else sys.executable
            command = [str(python), str(script)]
        else:
            command = ["bash", "-euo", "pipefail", "-c", code]
        print(f"$ {code.strip()}", flush=True)
        if block.lang == "bash" and _SERVER.search(code):
            code = code.rstrip().removesuffix("&")
            command = ["bash", "-euo", "pipefail", "-c", code]
            self.stack.enter_context(self.server(command, code, block))
            return Outcome(block, True)
        output, status = _run_echoed(command)
        if status != 0:
            raise AssertionError(f"{block} exited {status}:\n{output[-5000:]}")
        if block.expected is None and '{"error":' in output:
            raise AssertionError(f"{block} printed an error body:\n{output}")
        expected = block.expected and self.swap_ports(block.expected)
        if expected is not None and not matches(output, expected):
            raise AssertionError(f"{block} printed:\n{output}\nthe document shows:\n{expected}")
        return Outcome(block, True)

    @contextmanager
    def server(self, command: list[str], code: str, block: Block) -> Iterator[None]:
        """The block in the background, once its port answers /health; stopped on exit."""
        port = re.findall(r"--port (\d+)", code)[-1]
        log = self.workdir / f"server-{block.line}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            deadline = time.monotonic() + 900  # the README's first command installs first
            while not _healthy(int(port)):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{block} did not come up:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
            yield
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def _run_echoed(command: list[str]) -> tuple[str, int]:
    """Run ``command``, echoing its output line by line as it comes (a test run takes minutes)."""
    lines = []
    with subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    output = "".join(lines)
    if output and not output.endswith("\n"):
        print(flush=True)
    return output, process.returncode


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def matches(output: str, expected: str) -> bool:
    got = output.rstrip("\n").split("\n")
    want = expected.rstrip("\n").split("\n")
    if len(got) != len(want):
        return False
    return all(
        g.startswith(w[:-3]) if w.endswith("...") else g.rstrip() == w.rstrip()
        for g, w in zip(got, want, strict=True)
    )


def read(path: Path, *, installed: bool, select: str = "", exclude: str = "") -> list[Outcome]:
    """Run the blocks of ``path`` (those containing ``select``, none containing ``exclude``)."""
    chosen = [b for b in blocks(path) if select in b.code and not (exclude and exclude in b.code)]
    with (
        tempfile.TemporaryDirectory(prefix="doc-commands-") as tmp,
        Reader(installed, Path(tmp)) as reader,
    ):
        return [reader.run(block) for block in chosen]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("document", type=Path)
    parser.add_argument("--select", default="", help="only blocks containing this text")
    parser.add_argument("--exclude", default="", help="no blocks containing this text")
    args = parser.parse_args()
    for outcome in read(args.document, installed=False, select=args.select, exclude=args.exclude):
        if not outcome.ran:
            print(f"skipped {outcome.block}: {outcome.reason}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
