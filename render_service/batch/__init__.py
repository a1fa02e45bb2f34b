"""``render-service batch render|derender IN.jsonl OUT.jsonl``: HTTP bodies in, answers out."""

from __future__ import annotations

from render_service.batch.runner import BatchOptions, run_batch

__all__ = ["BatchOptions", "run_batch"]
