"""Errors raised while configuring parsers (never for bad model output).

ParserConfigError (ValueError)
 ├── UnknownParserError      a --reasoning-parser / --tool-call-parser name we do not have
 └── UnsupportedModelError   the model's tokenizer lacks a marker token the family needs
"""

from __future__ import annotations

__all__ = ["ParserConfigError", "UnknownParserError", "UnsupportedModelError"]


class ParserConfigError(ValueError):
    """A parser cannot be built with this configuration."""


class UnknownParserError(ParserConfigError):
    """No parser family is registered under this name."""


class UnsupportedModelError(ParserConfigError):
    """The tokenizer does not have the marker tokens this family matches by id."""
