"""The embedded default model: Qwen's BPE ranks and our ChatML template, built on first use."""

from __future__ import annotations

from render_service.model.default_model.build import default_cache_root, ensure_default_model

__all__ = ["default_cache_root", "ensure_default_model"]
