"""The command line is derived from Settings: flags, defaults, help, choices, version."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import get_args, get_type_hints

import msgspec
import pytest

from render_service import __version__
from render_service.http.cli import build_parser, parse_settings
from render_service.settings import DEFAULTS, Settings, reasoning_parser_names, tool_parser_names

REPO = Path(__file__).resolve().parents[3]


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "render_service", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def serve_help() -> str:
    out = run_cli("serve", "--help")
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())  # argparse wraps lines


def test_version() -> None:
    out = run_cli("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"render-service {__version__}"


def test_every_settings_field_is_a_flag_and_no_flag_is_not_one() -> None:
    (serve,) = [
        a.choices["serve"] for a in build_parser()._actions if hasattr(a, "choices") and a.choices
    ]
    dests = {a.dest for a in serve._actions if a.dest != "help"}
    assert dests == {f.name for f in msgspec.structs.fields(Settings)}


def test_help_shows_defaults_and_choices() -> None:
    text = serve_help()
    assert (
        "--max-messages MAX_MESSAGES messages per chat request (0: no limit) (default: 2048)"
        in text
    )
    assert "--media-executor {process,thread}" in text
    assert "(default: thread)" in text
    assert "--reasoning-parser {" + ",".join(reasoning_parser_names()) + "}" in text
    assert "--tool-call-parser {" + ",".join(tool_parser_names()) + "}" in text
    assert "(default: $VLLM_API_KEY)" in text


def test_help_never_shows_a_secret_from_the_environment() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "render_service", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={
            "VLLM_API_KEY": "sekrit-key",
            "RENDER_SERVICE_STATE_SECRET": "sekrit-state",
            "PATH": "",
        },
    )
    assert out.returncode == 0, out.stderr
    assert "sekrit" not in out.stdout


def test_unknown_parser_fails_at_startup_listing_valid_names(tmp_path: Path) -> None:
    out = run_cli("serve", str(tmp_path), "--reasoning-parser", "no_such_family")
    assert out.returncode == 2
    assert "no_such_family" in out.stderr
    assert ", ".join(reasoning_parser_names()) in out.stderr
    out = run_cli("serve", str(tmp_path), "--enable-auto-tool-choice", "--tool-call-parser", "nope")
    assert out.returncode == 2
    assert ", ".join(tool_parser_names()) in out.stderr


def test_flags_reach_settings_and_unset_ones_keep_the_defaults(tmp_path: Path) -> None:
    settings = parse_settings([str(tmp_path), "--max-tools", "3", "--no-trust-request-mm-kwargs"])
    assert settings.max_tools == 3
    assert settings.max_messages == DEFAULTS["max_messages"]
    assert settings.served_model_name == str(tmp_path)


def test_library_settings_refuse_an_unknown_parser() -> None:
    with pytest.raises(ValueError, match="valid names"):
        Settings(model="m", tool_call_parser="nope", enable_auto_tool_choice=True)


def test_deployment_doc_defaults_are_the_settings_defaults() -> None:
    """docs/deployment.md's flag table states each literal default as Settings has it."""
    doc = (REPO / "docs" / "deployment.md").read_text()
    rows = re.findall(r"^\| `--([a-z-]+)` \| `([^`]*)` \|", doc, re.MULTILINE)
    assert len(rows) > 20
    for flag, shown in rows:
        name = flag.replace("-", "_")
        (option,) = get_args(get_type_hints(Settings, include_extras=True)[name])[1:]
        default = DEFAULTS[name]
        if shown.startswith("$"):  # read from a variable when the flag is not given
            assert option.env == shown[1:], flag
        elif default is None:  # computed: the help describes it
            assert option.default == shown, flag
        elif isinstance(default, (int, float)):
            assert float(shown) == default, flag
        else:
            assert shown == str(default), flag
