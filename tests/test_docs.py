"""The user docs read true against the code: their commands run as a reader runs them
(tests/doc_commands.py), and the facts they list are the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_commands import SHARED_QWEN3, Outcome, blocks, read

REPO = Path(__file__).resolve().parents[1]


def check(outcomes: list[Outcome]) -> None:
    assert outcomes
    for outcome in outcomes:
        assert outcome.ran or str(SHARED_QWEN3) in outcome.reason, outcome


def test_quickstart_commands_run_and_print_what_it_shows() -> None:
    check(read(REPO / "docs" / "quickstart.md", installed=True))


def test_readme_commands_run_except_the_test_suite() -> None:
    """The README's install lines and its test command run in .ci/run's newcomer run (a fresh
    clone); here the rest of it runs (the server, Try it, the library)."""
    check(read(REPO / "README.md", installed=True, exclude="pytest"))


@pytest.mark.parametrize("doc", ["README.md", "docs/quickstart.md"])
def test_every_python_and_bash_block_is_run(doc: str) -> None:
    """A block the reader cannot run as written (a shell prompt, an undefined name) fails here
    before it fails a reader: each is a complete command or program."""
    for block in blocks(REPO / doc):
        assert not block.code.lstrip().startswith("$"), block
        if block.lang == "python":
            compile(block.code, f"{doc}:{block.line}", "exec")


def test_api_doc_lists_every_route() -> None:
    from starlette.routing import Route

    from render_service.http.app import build_app
    from render_service.render import Renderer

    doc = (REPO / "docs" / "api.md").read_text()
    table = set(re.findall(r"^\| (GET|POST) \| `([^`]+)` \|", doc, re.MULTILINE))
    from render_service.model.default_model import ensure_default_model

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
    import parsers

    doc = (REPO / "docs" / "deployment.md").read_text()
    (row,) = [line for line in doc.splitlines() if line.startswith(f"| `{flag}` |")]
    listed = re.findall(r"`([a-z0-9_]+)`", row.split("one of", 1)[1].split("(")[0])
    assert listed == getattr(parsers, registered)()
