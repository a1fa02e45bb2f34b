"""The user docs read true against the code: their commands run as a reader runs them
(tests/doc_commands.py), and the facts they list are the code's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.routing import Route

import parsers
from bench.cli import _parser
from render_service import __version__
from render_service.http.app import build_app
from render_service.model.default_model import ensure_default_model
from render_service.render import Renderer
from tests.doc_commands import SHARED_MODELS, Block, Outcome, Reader, blocks, read

REPO = Path(__file__).resolve().parents[1]


def check(outcomes: list[Outcome]) -> None:
    assert outcomes
    for outcome in outcomes:
        assert outcome.ran or str(SHARED_MODELS) in outcome.reason, outcome


def test_quickstart_commands_run_and_print_what_it_shows() -> None:
    check(read(REPO / "docs" / "quickstart.md", installed=True))


@pytest.mark.skipif(
    os.environ.get("RENDER_SERVICE_README_RAN") == "1",
    reason=".ci/run's newcomer run ran the README's commands from its fresh install already",
)
def test_readme_commands_run_except_the_test_suite() -> None:
    """The README's install lines and its test command run in .ci/run's newcomer run (a fresh
    clone, which runs the rest too, once); here the rest of it runs (the server, Try it, the
    library)."""
    check(read(REPO / "README.md", installed=True, exclude="pytest"))


def test_commands_run_from_a_checkout_whose_path_has_a_space(tmp_path: Path) -> None:
    """.ci/run reads the docs in a clone under a path with a space: the environment's paths
    put into a command stay one word, and its install steps are still left out."""
    spaced = tmp_path / "first hour"
    spaced.mkdir()
    (spaced / "bin").symlink_to(Path(sys.executable).parent, target_is_directory=True)
    install = "python3 -m venv .venv && .venv/bin/pip install -c constraints.txt '.[images]'"
    block = Block("bash", f"{install} && .venv/bin/render-service --version\n", None, 1)
    with Reader(True, tmp_path, spaced / "bin") as reader:
        assert reader.prepare(block) == f"'{spaced}/bin'/render-service --version\n"
        block.expected = f"render-service {__version__}\n"
        assert reader.run(block).ran


@pytest.mark.parametrize("doc", ["README.md", "docs/quickstart.md"])
def test_every_python_and_bash_block_is_run(doc: str) -> None:
    """A block the reader cannot run as written (a shell prompt, an undefined name) fails here
    before it fails a reader: each is a complete command or program."""
    for block in blocks(REPO / doc):
        assert not block.code.lstrip().startswith("$"), block
        if block.lang == "python":
            compile(block.code, f"{doc}:{block.line}", "exec")


def test_api_doc_lists_every_route() -> None:
    doc = (REPO / "docs" / "api.md").read_text()
    table = set(re.findall(r"^\| (GET|POST) \| `([^`]+)` \|", doc, re.MULTILINE))
    with Renderer.from_pretrained(str(ensure_default_model())) as renderer:
        app = build_app(renderer)
    routes = {
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    assert routes == table


@pytest.mark.parametrize(
    ("flag", "registered"),
    [
        ("--reasoning-parser", "known_reasoning_parsers"),
        ("--tool-call-parser", "known_tool_parsers"),
    ],
)
def test_deployment_doc_lists_every_registered_parser(flag: str, registered: str) -> None:
    doc = (REPO / "docs" / "deployment.md").read_text()
    (row,) = [line for line in doc.splitlines() if line.startswith(f"| `{flag}` |")]
    listed = re.findall(r"`([a-z0-9_]+)`", row.split("one of", 1)[1].split("(")[0])
    assert listed == getattr(parsers, registered)()


def test_bench_readme_commands_as_far_as_this_machine_can(tmp_path: Path) -> None:
    """`compare` needs vLLM's venv and minutes (measured by hand, bench/README.md says how
    long); here: the test command, `report` on a copy of a shipped result, every option of
    the options table, and `compare` without a model stopping at once with what to pass."""
    readme = REPO / "bench" / "README.md"
    check(read(readme, installed=True, select="tests/bench"))
    commands = [b.code for b in blocks(readme) if "python -m bench" in b.code]
    assert commands and all(
        c.count("PYTHONPATH=. .venv/bin/python -m bench") == 3 for c in commands
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    shown = re.search(r"-m bench report (\S+)", commands[0])
    assert shown is not None
    result = tmp_path / Path(shown.group(1)).name
    shutil.copy(REPO / shown.group(1), result)
    done = subprocess.run(
        [sys.executable, "-m", "bench", "report", str(result)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / result.name.replace(".json", ".md")).is_file()

    done = subprocess.run(
        [sys.executable, "-m", "bench", "compare", "--quick", "--model", str(tmp_path / "none")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "pass --model DIR, any local model directory" in done.stderr

    (compare,) = [a.choices["compare"] for a in _parser()._actions if getattr(a, "choices", None)]
    options = {o for a in compare._actions for o in a.option_strings if o != "-h"} - {"--help"}
    rows = set(re.findall(r"^\| `(--[a-z-]+)", readme.read_text(), re.MULTILINE))
    assert rows == options
