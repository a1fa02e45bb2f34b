"""The served model, as both directions use it: loading (tokenizer, template, config), prompt
tokenization, chat templates and their sandbox, the embedded default model, and the setup of the
model's reasoning and tool-call parsers."""

from __future__ import annotations

import logging


class _NoTorchNotice(logging.Filter):
    """transformers says at import that PyTorch is missing: true, and irrelevant here (no model
    weights are ever loaded), so it is dropped wherever this package imports transformers."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


logging.getLogger("transformers").addFilter(_NoTorchNotice())
