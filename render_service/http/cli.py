"""``render-service serve MODEL [flags]``: vLLM's flag names, each derived from a Settings field.

The flags, their defaults, help text and valid choices all come from ``Settings`` (its
``Option`` metadata): adding a field adds its flag.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import msgspec

from render_service import __version__
from render_service.http.vllm_flags import refusal
from render_service.settings import Option, Settings


def _json_dict(value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return parsed


def _unwrap(hint: Any) -> tuple[Any, Option]:
    """A field's type without ``Annotated`` and ``| None``, and its Option."""
    base, *extras = get_args(hint)
    option = next(e for e in extras if isinstance(e, Option))
    if get_origin(base) in (Union, types.UnionType):
        base = next(a for a in get_args(base) if a is not type(None))
    return base, option


def _shown(option: Option, default: Any) -> str:
    """The default as the help states it (never the value of a variable: it may be a secret)."""
    if option.env is not None:
        return f"${option.env}"
    if option.default is not None:
        return option.default
    if default is None:
        return "none"
    if isinstance(default, bool):
        return "on" if default else "off"
    return str(default)


def _flag_kwargs(base: Any, option: Option, default: Any) -> dict[str, Any]:
    shown = _shown(option, default)
    kwargs: dict[str, Any] = {"help": f"{option.help} (default: {shown})", "default": default}
    if base is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
        return kwargs
    if get_origin(base) is Literal:
        kwargs["choices"] = list(get_args(base))
    elif get_origin(base) is dict:
        kwargs["type"] = _json_dict
    else:
        kwargs["type"] = base
    if option.choices is not None:
        # Checked by Settings (which also accepts "none"); the help lists the valid names.
        kwargs["metavar"] = "{" + ",".join(option.choices()) + "}"
    elif option.metavar is not None:
        kwargs["metavar"] = option.metavar
    return kwargs


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The ``render-service`` command line; ``environ`` supplies the options' variables."""
    env = os.environ if environ is None else environ
    # "@FILE" reads more arguments from FILE, one per line (how docker/k8s passes a ConfigMap).
    parser = argparse.ArgumentParser(
        prog="render-service", description=__doc__, fromfile_prefix_chars="@"
    )
    parser.add_argument("--version", action="version", version=f"render-service {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    # No abbreviations: a shortened or misspelt flag must never silently become another one.
    serve = sub.add_parser("serve", help="serve one model over HTTP", allow_abbrev=False)
    sub.add_parser("batch", help="render or derender a JSONL file (render-service batch --help)")
    hints = get_type_hints(Settings, include_extras=True)
    for field in msgspec.structs.fields(Settings):
        base, option = _unwrap(hints[field.name])
        default = None if field.default is msgspec.NODEFAULT else field.default
        if option.env is not None:
            default = env.get(option.env, default)
        kwargs = _flag_kwargs(base, option, default)
        if field.name == "model":
            serve.add_argument("model", nargs="?", help=kwargs["help"])
        else:
            serve.add_argument("--" + field.name.replace("_", "-"), **kwargs)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings of a parsed ``serve`` command line (ValueError for an invalid one)."""
    values = {f.name: getattr(args, f.name) for f in msgspec.structs.fields(Settings)}
    model = args.model
    if model is None:
        from render_service.model.default_model import ensure_default_model

        values["model"] = str(ensure_default_model())
    values["served_model_name"] = args.served_model_name or (model if model else "default")
    return Settings(**values)


def parse_settings(argv: Sequence[str]) -> Settings:
    """Settings from a ``serve`` command line (without the leading ``serve``)."""
    parser = build_parser()
    return _settings(parser, _parse(parser, ["serve", *argv]))


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line, with each flag it does not know refused by name: a vLLM flag with the
    reason it does not apply here, another with the closest flag we have."""
    args, unknown = parser.parse_known_args(argv)
    if not unknown:
        return args
    ours = _serve_flags(parser)
    lines = []
    for i, word in enumerate(unknown):
        if not word.startswith("-"):
            after_flag = i > 0 and unknown[i - 1].startswith("-") and "=" not in unknown[i - 1]
            if not after_flag:  # else it is the value of the flag just refused
                lines.append(f"unexpected argument {word!r}")
            continue
        reason = refusal(word, ours)
        if reason is None:
            name = word.split("=", 1)[0]
            close = difflib.get_close_matches(name, ours, n=1)
            reason = f"unrecognized flag {name}" + (f" (did you mean {close[0]}?)" if close else "")
        lines.append(reason)
    parser.error(
        "\n  ".join(["the command line has arguments render-service does not take:", *lines])
    )


def _serve_flags(parser: argparse.ArgumentParser) -> list[str]:
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    serve = subcommands.choices["serve"]
    return [option for action in serve._actions for option in action.option_strings]


def _settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Settings:
    try:
        return settings_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["batch"]:  # its own parser; serve's flags pass through to Settings
        from render_service.batch.cli import main as batch

        batch(argv[1:])
        return
    parser = build_parser()
    settings = _settings(parser, _parse(parser, argv))
    from render_service.http.server import StartupError, serve
    from render_service.multimodal import MissingImageExtra

    try:
        serve(settings)
    except (MissingImageExtra, StartupError) as exc:
        sys.exit(f"render-service: {exc}")


if __name__ == "__main__":
    main(sys.argv[1:])
