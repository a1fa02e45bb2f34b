from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from hypothesis import settings

# No timing assertions: on a loaded machine hypothesis's per-example deadline fails correct code.
settings.register_profile("render-service", deadline=None)
settings.load_profile("render-service")
