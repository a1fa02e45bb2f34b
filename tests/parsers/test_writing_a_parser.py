"""Runs the examples of docs/writing-a-parser.md against the real API.

The toy tool family is added the way the page says, to a copy of `parsers/`: its module, one
registry row and its test file, nothing else; its test then runs in a fresh interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from parsers import ChatParser, ParseRequest, TokenizerFacts
from tests.parsers import _golden as g

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
PAGE = REPO / "docs" / "writing-a-parser.md"
EXAMPLE = EXAMPLES / "mini_think.py"
#: The registry edit the page shows: one import and one row.
TOY_IMPORT = "from parsers.tools import toy\n"
TOY_ROW = '    ParserFamily("toy", "tool", toy.build, toy.ToyCall),\n'


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mini_think", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_family_parses() -> None:
    facts = TokenizerFacts.from_added_tokens({"<reasoning>": 10, "</reasoning>": 11})
    config = _load().build(facts)
    parser = ChatParser.build(config, None, ParseRequest())
    state = parser.start([1, 2, 3])
    state, first = parser.feed(state, [10, 500, 501], "<reasoning>Let me see")
    state, second = parser.feed(state, [11, 502], "</reasoning>Yes.")
    state, last = parser.finish(state)
    msg = g.accumulate(first + second + last)
    assert (msg.reasoning, msg.content) == ("Let me see", "Yes.")


def test_page_shows_the_toy_family_as_tested() -> None:
    page = PAGE.read_text(encoding="utf-8")
    for example in ("toy.py", "test_toy.py"):
        assert (EXAMPLES / example).read_text(encoding="utf-8") in page, example
    assert TOY_IMPORT in page
    assert TOY_ROW in page


def _add_row(registry: Path) -> None:
    """Insert the toy's import after the registry's last import and its row last in FAMILIES."""
    lines = registry.read_text(encoding="utf-8").splitlines(keepends=True)
    last_import = max(i for i, line in enumerate(lines) if line.startswith("from parsers."))
    if lines[last_import].endswith("(\n"):  # an import wrapped over lines ends at its ")"
        last_import = lines.index(")\n", last_import)
    lines.insert(last_import + 1, TOY_IMPORT)
    start = next(i for i, line in enumerate(lines) if line.startswith("FAMILIES:"))
    end = next(i for i in range(start, len(lines)) if lines[i] == ")\n")
    lines.insert(end, TOY_ROW)
    registry.write_text("".join(lines), encoding="utf-8")


def test_toy_family_is_one_module_one_row_one_test(tmp_path: Path) -> None:
    root = tmp_path / "project with spaces"
    shutil.copytree(
        REPO / "parsers", root / "parsers", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(EXAMPLES / "toy.py", root / "parsers" / "tools" / "toy.py")
    _add_row(root / "parsers" / "registry.py")
    (root / "tests" / "parsers").mkdir(parents=True)
    shutil.copy(EXAMPLES / "test_toy.py", root / "tests" / "parsers" / "test_toy.py")
    env = {**os.environ, "PYTHONPATH": str(root)}
    check = "import parsers; print(parsers.__file__); print('toy' in parsers.known_tool_parsers())"
    run = subprocess.run(
        [sys.executable, "-c", check], cwd=root, env=env, capture_output=True, text=True
    )
    assert run.stdout.splitlines() == [str(root / "parsers" / "__init__.py"), "True"], run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error",
         "tests/parsers/test_toy.py"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout
