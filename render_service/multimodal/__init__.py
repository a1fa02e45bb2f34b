"""Images in chat requests, processed on CPU into the ``features`` vLLM 0.33's engine consumes."""

from __future__ import annotations

from render_service.multimodal.pipeline import MediaBatch, MediaPipeline

# What a Qwen2-VL-family chat template writes for an image (used for string-format templates).
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"

__all__ = ["IMAGE_PLACEHOLDER", "MediaBatch", "MediaPipeline"]
