"""Images in chat requests, processed on CPU into the ``features`` vLLM 0.33's engine consumes."""

from __future__ import annotations

from render_service.multimodal.pipeline import IMAGE_PLACEHOLDER, MediaBatch, MediaPipeline

__all__ = ["IMAGE_PLACEHOLDER", "MediaBatch", "MediaPipeline"]
