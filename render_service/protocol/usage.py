"""UsageInfo: token counts in chat and completion responses."""

from __future__ import annotations

import msgspec


class UsageInfo(msgspec.Struct, kw_only=True, gc=False):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: None = None
    completion_tokens_details: None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> UsageInfo:
        return cls(
            prompt_tokens=prompt_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            completion_tokens=completion_tokens,
        )
