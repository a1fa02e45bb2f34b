"""``render-service batch render|derender IN.jsonl OUT.jsonl --model MODEL [serve flags]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from render_service.batch.runner import BatchError, BatchOptions, run_batch


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="render-service batch",
        description=(
            "Render or derender a JSONL file of HTTP request bodies, one answer line per input "
            "line ({'line': N, 'result': ...} or {'line': N, 'error': ...}), in input order. "
            "Any other flag is a `render-service serve` flag (parsers, template, limits)."
        ),
    )
    parser.add_argument("mode", choices=["render", "derender"])
    parser.add_argument("source", metavar="IN.jsonl")
    parser.add_argument("target", metavar="OUT.jsonl")
    parser.add_argument("--model", help="model directory or offline hub id (default: embedded)")
    parser.add_argument("--workers", type=int, default=0, help="processes (default: every core)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted run after OUT's last complete line",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str]) -> None:
    from render_service.http.cli import parse_settings

    parser = build_parser()
    args, serve_flags = parser.parse_known_args(argv)
    if args.workers < 0:
        parser.error("--workers must be 0 (every core) or more")
    settings = parse_settings([args.model, *serve_flags] if args.model else list(serve_flags))
    options = BatchOptions(
        mode=args.mode,
        source=args.source,
        target=args.target,
        workers=args.workers,
        resume=args.resume,
        progress=not args.no_progress,
    )
    try:
        errors = run_batch(settings, options)
    except (BatchError, OSError) as exc:
        sys.exit(f"render-service batch: {exc}")
    except KeyboardInterrupt:
        print("render-service batch: interrupted; --resume continues the run", file=sys.stderr)
        sys.exit(130)
    if errors:
        print(f"render-service batch: {errors} line(s) answered with an error", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
