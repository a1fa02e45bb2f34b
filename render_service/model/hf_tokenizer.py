"""A Hugging Face tokenizer's backend and special-token facts, with or without transformers.

vLLM loads the tokenizer with ``AutoTokenizer.from_pretrained``; importing transformers and
running it costs seconds at start. The service only needs its backend (a ``tokenizers.Tokenizer``)
and a few facts about special tokens, so where the tokenizer class and files are of a kind whose
loading we have read in transformers' source and replicate here, we build them from the files with
``tokenizers`` alone. Every other case (remote code, a class not on the list below, settings that
make transformers change the backend in ways we do not replicate) goes through transformers.

What transformers 5.23 does for the admitted kinds (read in its source), and this module too:

- **The class.** ``AutoTokenizer`` picks it from tokenizer_config.json's ``tokenizer_class`` and
  config.json's ``model_type`` (e.g. a ``LlamaTokenizerFast`` with a ByteLevel tokenizer.json
  becomes the generic backend; ``model_type`` qwen2 makes it ``Qwen2Tokenizer``). Only the pairs in
  ``_VERIFIED`` are admitted; the tests check each against transformers on real model directories.
- **The generic backend** (``TokenizersBackend``, alias ``PreTrainedTokenizerFast``): the file as
  it is, except that a file without a post-processor gets ``TemplateProcessing("$A:0")`` (the
  ``add_bos_token``/``add_eos_token`` keys are dropped when a tokenizer.json exists).
- **Qwen2Tokenizer** rebuilds the normalizer (NFC), the pre-tokenizer (its own regex, then
  ByteLevel without regex) and the decoder (ByteLevel with defaults) over the file's vocabulary,
  merges and post-processor, then re-adds tokenizer_config.json's added tokens in id order.
- **Special tokens** (named ``*_token`` keys, ``additional_special_tokens``/``extra_special_tokens``)
  are added to the backend when no added token has their text (Qwen2Tokenizer re-adds them all as
  ``AddedToken(text, special=True)``, replacing a token with other flags). We admit only files where
  every one of them already is there (for Qwen2Tokenizer with exactly those flags), so nothing
  changes, and where tokenizer_config.json's ``added_tokens_decoder`` equals the file's added
  tokens.

Read in transformers 5.23.0 (the version constraints.txt pins). With another release installed
(its version read from its ``__init__.py``, not imported) everything goes through transformers
until that release is read and ``VERIFIED_TRANSFORMERS`` moves; the tests compare both loaders on
every shared model directory, so they fail then, as they would for a release that loads
differently.

Refused here (transformers decides): truncation or padding in the file, ``split_special_tokens``,
``fix_mistral_regex``, ``auto_map`` or ``--trust-remote-code``, added_tokens.json or
special_tokens_map.json without ``added_tokens_decoder``, special tokens given as objects where a
string is expected. ``RENDER_SERVICE_TOKENIZER_LOADER=transformers`` forces transformers for any
model (for debugging a difference).
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

#: Set to "transformers" to load every tokenizer with transformers (the fast path is off).
LOADER_ENV = "RENDER_SERVICE_TOKENIZER_LOADER"
#: The transformers releases whose loading this module replicates.
VERIFIED_TRANSFORMERS = "5.23."

# PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES: the named special tokens, in their order.
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# transformers' models/qwen2/tokenization_qwen2.py PRETOKENIZE_REGEX (a test checks it is equal).
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# Qwen2Tokenizer's special-token defaults (its __init__ signature).
_QWEN2_DEFAULTS = {
    "unk_token": "<|endoftext|>",
    "eos_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
}

_GENERIC = "TokenizersBackend"
_QWEN2 = "Qwen2Tokenizer"
# (tokenizer_config.json tokenizer_class, config.json model_type) -> the class AutoTokenizer loads.
# Only pairs checked against transformers on real directories (tests/.../test_hf_tokenizer.py).
_VERIFIED: dict[tuple[str, str], str] = {
    ("Qwen2Tokenizer", "qwen2"): _QWEN2,
    ("Qwen2Tokenizer", "qwen2_5_vl"): _QWEN2,
    ("Qwen2Tokenizer", "qwen3"): _QWEN2,
    ("Qwen2Tokenizer", "qwen3_moe"): _QWEN2,
    ("LlamaTokenizerFast", "qwen2"): _QWEN2,
    # A ByteLevel tokenizer.json only (transformers checks for the string, so do we).
    ("LlamaTokenizerFast", "deepseek_v3"): _GENERIC,
    ("PreTrainedTokenizerFast", "gpt_oss"): _GENERIC,
    ("PreTrainedTokenizerFast", "llama"): _GENERIC,
    ("PreTrainedTokenizer", "glm4_moe"): _GENERIC,
    ("GPT2Tokenizer", "minimax_m2"): _GENERIC,
}
# Keys of tokenizer_config.json whose presence makes transformers change the backend or the
# special tokens in ways not replicated here.
_REFUSED_KEYS = ("auto_map", "fix_mistral_regex")


@dataclass(frozen=True)
class HFTokenizer:
    """What the service uses of a Hugging Face tokenizer: the backend and its special tokens."""

    backend: tokenizers.Tokenizer
    #: ``special_tokens_map``: named special tokens (bos_token, eos_token, ...) as strings.
    special_tokens_map: dict[str, str]
    #: ``all_special_ids``: ids of the named and extra special tokens (transformers gives None
    #: for a special token missing from the vocabulary: dropped, it names no id).
    all_special_ids: tuple[int, ...]
    eos_token_id: int | None
    bos_token_id: int | None
    #: Whether transformers loaded it (else this module did, from the files).
    by_transformers: bool

    @classmethod
    def from_transformers(cls, hf: Any) -> HFTokenizer:
        return cls(
            backend=hf.backend_tokenizer,
            special_tokens_map=dict(hf.special_tokens_map),
            all_special_ids=tuple(i for i in hf.all_special_ids if i is not None),
            eos_token_id=hf.eos_token_id,
            bos_token_id=hf.bos_token_id,
            by_transformers=True,
        )


def transformers_forced() -> bool:
    return os.environ.get(LOADER_ENV, "").strip().lower() == "transformers"


@cache
def installed_transformers() -> str | None:
    """The installed transformers' version, read from its ``__init__.py`` (importing it is what
    this module avoids); None when it is not installed or says no version."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return None
    with open(spec.origin, encoding="utf-8") as f:
        match = re.search(r'^__version__ = "([^"]+)"', f.read(8192), re.MULTILINE)
    return match.group(1) if match else None


def load_without_transformers(
    path: Path, tokenizer_config: Mapping[str, Any], model_type: str | None
) -> HFTokenizer | None:
    """The tokenizer of ``path`` as transformers would load it, or None when that is not proven."""
    file = path / "tokenizer.json"
    if transformers_forced() or not file.is_file() or not tokenizer_config:
        return None
    if not (installed_transformers() or "").startswith(VERIFIED_TRANSFORMERS):
        return None
    kind = _VERIFIED.get((str(tokenizer_config.get("tokenizer_class")), str(model_type)))
    if kind is None or any(key in tokenizer_config for key in _REFUSED_KEYS):
        return None
    if tokenizer_config.get("split_special_tokens"):
        return None
    if tokenizer_config.get("tokenizer_class") == "LlamaTokenizerFast" and kind == _GENERIC:
        with file.open("rb") as f:
            if b'"ByteLevel"' not in f.read():
                return None
    has_decoder = "added_tokens_decoder" in tokenizer_config
    if not has_decoder and any(
        (path / name).exists() for name in ("special_tokens_map.json", "added_tokens.json")
    ):
        return None
    special = _special_tokens(tokenizer_config, _QWEN2_DEFAULTS if kind == _QWEN2 else {})
    if special is None:
        return None
    named, extra = special
    backend = tokenizers.Tokenizer.from_file(str(file))
    if backend.truncation is not None or backend.padding is not None:
        return None
    added = backend.get_added_tokens_decoder()
    if has_decoder and not _same_added_tokens(tokenizer_config["added_tokens_decoder"], added):
        return None
    by_content = {token.content: token for token in added.values()}
    # transformers adds each special token the backend lacks; Qwen2Tokenizer then re-adds every
    # one as AddedToken(content, special=True), which replaces a token that differs from that.
    plain_special = _flags(AddedToken("x", special=True))
    for content in [*named.values(), *extra]:
        token = by_content.get(content)
        if token is None or (kind == _QWEN2 and _flags(token) != plain_special):
            return None
    if kind == _QWEN2 and not _rebuild_as_qwen2(backend, tokenizer_config, added):
        return None
    if backend.post_processor is None:
        backend.post_processor = processors.TemplateProcessing(
            single="$A:0", pair="$A:0 $B:1", special_tokens=[]
        )
    # Every special token is an added token (checked above), so each has an id.
    ids = {token.content: token_id for token_id, token in added.items()}
    all_special = list(dict.fromkeys([*named.values(), *extra]))
    return HFTokenizer(
        backend=backend,
        special_tokens_map=dict(named),
        all_special_ids=tuple(ids[c] for c in all_special),
        eos_token_id=ids.get(named.get("eos_token", "")),
        bos_token_id=ids.get(named.get("bos_token", "")),
        by_transformers=False,
    )


def _token_content(value: Any) -> str | None:
    """A named special token's text: a string, or a serialized AddedToken (None: not admitted)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and value.get("__type") == "AddedToken":
        content = value.get("content")
        return content if isinstance(content, str) else None
    return None


def _special_tokens(
    config: Mapping[str, Any], defaults: Mapping[str, str]
) -> tuple[dict[str, str], list[str]] | None:
    """(named special tokens in transformers' order, extra special tokens), or None if not admitted.

    Named: the seven standard names (the class's defaults where the config has no key; a null
    value means none), then model-specific ``*_token`` string keys and an ``extra_special_tokens``
    mapping. Extra: ``extra_special_tokens`` as a list, else ``additional_special_tokens``.
    """
    named: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name, defaults.get(name))
        if value is None:
            continue
        content = _token_content(value)
        if content is None:
            return None
        named[name] = content
    for key, value in config.items():
        if key in SPECIAL_TOKEN_NAMES or not key.endswith("_token"):
            continue
        if isinstance(value, str):
            named[key] = value
        elif isinstance(value, dict):  # an AddedToken object: transformers' path differs
            return None
    extras_value = config.get("extra_special_tokens")
    if isinstance(extras_value, dict):
        for key, value in extras_value.items():
            if not isinstance(value, str):
                return None
            named[key] = value
        extras_value = None
    if not extras_value:
        extras_value = config.get("additional_special_tokens") or []
    if not isinstance(extras_value, list) or not all(isinstance(t, str) for t in extras_value):
        return None
    return named, list(extras_value)


def _flags(token: AddedToken) -> tuple[bool, bool, bool, bool, bool]:
    return (token.special, token.normalized, token.lstrip, token.rstrip, token.single_word)


def _same_added_tokens(declared: Any, added: Mapping[int, AddedToken]) -> bool:
    """Whether tokenizer_config.json's added_tokens_decoder equals the file's added tokens."""
    if not isinstance(declared, dict) or len(declared) != len(added):
        return False
    for key, value in declared.items():
        if not isinstance(value, dict) or not str(key).isdigit():
            return False
        token = added.get(int(key))
        if token is None or token.content != value.get("content"):
            return False
        fields = ("special", "normalized", "lstrip", "rstrip", "single_word")
        # AddedToken's own defaults for a missing field: normalized = not special.
        special = bool(value.get("special", False))
        wanted = (
            special,
            bool(value.get("normalized", not special)),
            bool(value.get("lstrip", False)),
            bool(value.get("rstrip", False)),
            bool(value.get("single_word", False)),
        )
        if set(value) - {"content", "__type", *fields} or wanted != _flags(token):
            return False
    return True


def _rebuild_as_qwen2(
    backend: tokenizers.Tokenizer, config: Mapping[str, Any], added: Mapping[int, AddedToken]
) -> bool:
    """Give the backend Qwen2Tokenizer's normalizer, pre-tokenizer and decoder (False: refused).

    Qwen2Tokenizer builds a fresh BPE model from the file's vocabulary and merges with fixed
    options, so the file's model options must be those; it then adds the config's added tokens in
    id order, which gives each the id it has in the file only if ids are handed out the way the
    tokenizers library does (the model's id for a token in its vocabulary, else the next free one).
    """
    model = backend.model
    if not isinstance(model, BPE):
        return False
    reference = BPE(
        vocab={"<|endoftext|>": 0},
        merges=[],
        dropout=None,
        unk_token=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
    )
    options = (
        "dropout",
        "unk_token",
        "continuing_subword_prefix",
        "end_of_word_suffix",
        "fuse_unk",
        "byte_fallback",
        "ignore_merges",
    )
    if any(getattr(model, name) != getattr(reference, name) for name in options):
        return False
    add_prefix_space = config.get("add_prefix_space")
    if add_prefix_space is None:
        add_prefix_space = False
    if not isinstance(add_prefix_space, bool):
        return False
    base_size = backend.get_vocab_size(with_added_tokens=False)
    assigned: list[int] = []
    for token_id in sorted(added):
        in_vocab = model.token_to_id(added[token_id].content)
        if in_vocab is not None:
            expected = in_vocab
        elif not assigned:
            expected = base_size
        else:
            top = max(assigned)
            expected = top + 1 if top >= base_size or base_size == 0 else base_size
        if expected != token_id:
            return False
        assigned.append(expected)
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return True
