"""Side-by-side benchmark of render-service and vLLM 0.33.0's render server (`python -m bench`)."""

from __future__ import annotations
