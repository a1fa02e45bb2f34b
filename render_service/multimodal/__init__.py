"""Images in chat requests, processed on CPU into the ``features`` vLLM 0.33's engine consumes.

The image stack (numpy, Pillow, httpx, pybase64, numba, blake3) is the ``images`` extra
(``pip install 'render-service[images]'``). This module is light: ``media_pipeline`` imports the
stack only for a model that takes images, so a text server never loads it.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from render_service.model.loading import read_json

if TYPE_CHECKING:
    from render_service.multimodal.pipeline import MediaPipeline
    from render_service.settings import Settings

#: The image processors (preprocessor_config.json) of the models this package serves.
IMAGE_PROCESSORS = frozenset({"Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast"})
#: The top-level modules of the ``images`` extra.
IMAGE_STACK = ("numpy", "PIL", "httpx", "pybase64", "numba", "blake3")
INSTALL_HINT = "pip install 'render-service[images]'"


class MissingImageExtra(RuntimeError):
    """An image model is served by an install without the ``images`` extra."""


def image_processor(model_path: str | Path) -> str | None:
    """The ``image_processor_type`` of a model directory (None for a text model)."""
    kind = read_json(Path(model_path) / "preprocessor_config.json").get("image_processor_type")
    return kind if isinstance(kind, str) else None


def takes_images(model_path: str | Path) -> bool:
    """Whether this package serves the model's images (a Qwen2-VL-family processor)."""
    return image_processor(model_path) in IMAGE_PROCESSORS


def require_image_stack(model_name: str) -> None:
    """MissingImageExtra, one line naming the extra, when a module of the stack is missing."""
    for module in IMAGE_STACK:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise MissingImageExtra(
                f"{model_name} takes images, which need the 'images' extra ({module} is "
                f"missing): {INSTALL_HINT}"
            ) from exc


def media_pipeline(model_path: str, model_id: str, settings: Settings) -> MediaPipeline | None:
    """The image pipeline of an image model, or None for a text model (nothing imported)."""
    if not takes_images(model_path):
        return None
    require_image_stack(model_id)
    from render_service.multimodal.pipeline import MediaPipeline

    return MediaPipeline.for_model(model_path, model_id, settings)
