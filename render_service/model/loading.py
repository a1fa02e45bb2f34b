"""Loading one model's tokenizer, chat template and configuration (no weights)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import msgspec
import tokenizers

from render_service.errors import InvalidRequest, ModelNotFound
from render_service.model.harmony import HARMONY_MODEL_TYPES, HarmonyEncoder
from render_service.model.hf_tokenizer import HFTokenizer, load_without_transformers
from render_service.model.mistral import MistralTokenizer

# config.json keys that bound the context, as vLLM reads them (the smallest wins).
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# generation_config.json keys that become sampling defaults, under vLLM's names.
_SAMPLING_KEYS = {
    "repetition_penalty": "repetition_penalty",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
}


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What the render path needs to know about a model, as plain data."""

    path: str
    served_model_name: str
    model_type: str
    max_model_len: int
    sampling_defaults: dict[str, Any]
    eos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    chat_template: str | None


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of a model directory ({} when absent or not an object)."""
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def resolve_model_path(model: str, revision: str | None = None, what: str = "model") -> Path:
    """A local directory, or a hub id found in the local Hugging Face cache (offline)."""
    local = Path(model).expanduser()
    if local.is_dir():
        return local.resolve()
    from huggingface_hub import snapshot_download

    # Only ever the local cache: the server never downloads (local_files_only, whatever
    # HF_HUB_OFFLINE says).
    try:
        return Path(snapshot_download(model, revision=revision, local_files_only=True))
    except Exception as exc:  # the hub client raises many types; all mean "not available here"
        cached = "in the hub cache" if revision is None else f"in the hub cache at {revision!r}"
        raise FileNotFoundError(f"{what} {model!r} is neither a directory nor {cached}") from exc


_UNSCALED_ROPE_TYPES = frozenset(
    {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
)


def _max_model_len(config: dict[str, Any]) -> int:
    text_config = config.get("text_config") or {}
    values = [
        v
        for source in (config, text_config)
        for key in _CONTEXT_KEYS
        if isinstance(v := source.get(key), int) and v > 0
    ]
    if not values:
        return 2048
    length = min(values)
    scaling = config.get("rope_scaling") or {}
    # vLLM scales the context by the RoPE factor except for the types whose factor already
    # describes max_position_embeddings (YaRN: DeepSeek-V3.1 and gpt-oss stay at 163840 and 131072).
    if (
        isinstance(scaling, dict)
        and scaling.get("type", scaling.get("rope_type")) not in _UNSCALED_ROPE_TYPES
    ):
        length = int(length * float(scaling.get("factor") or 1.0))
    return length


def max_context_length(path: Path) -> int:
    """The context length a model directory's config gives (what --max-model-len may lower)."""
    return _max_model_len(read_json(path / "config.json"))


def _load_chat_template(path: Path, tokenizer_config: dict[str, Any]) -> str | None:
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if template is None:
        template = read_json(path / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: vLLM uses "default" (or the only one)
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _generation_config(path: Path, source: str) -> dict[str, Any]:
    """vLLM's ``--generation-config``: "auto", "vllm" (no model defaults) or a directory."""
    if source == "vllm":
        return {}
    folder = path if source == "auto" else Path(source).expanduser()
    if source != "auto" and not (folder / "generation_config.json").is_file():
        raise FileNotFoundError(
            f"--generation-config {source!r} is not a directory with a generation_config.json"
        )
    return read_json(folder / "generation_config.json")


def load_chat_template_arg(value: str) -> str:
    """``--chat-template``: a file path, or the template itself."""
    candidate = Path(value).expanduser()
    if candidate.is_file():
        return candidate.read_text(encoding="utf-8")
    if any(c in value for c in "{}\n"):
        return value
    raise FileNotFoundError(f"--chat-template {value!r} is neither a file nor a template")


def _as_ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int))
    return ()


@dataclass(frozen=True)
class Model:
    """A loaded model: its tokenizer and plain facts.

    In vLLM's default tokenizer mode that is a Hugging Face tokenizer (`hf`: its fast `backend`
    and special-token facts, loaded with or without transformers); with `--tokenizer-mode
    mistral` it is Mistral's tekken (`mistral`), and the HF fields are None. The methods below
    are the seam the rest of the service uses.
    """

    info: ModelInfo
    hf: HFTokenizer | None
    backend: tokenizers.Tokenizer | None
    mistral: MistralTokenizer | None = None
    #: The Harmony encoding, for models vLLM renders with Harmony (gpt-oss).
    harmony: HarmonyEncoder | None = None
    #: transformers' tokenizer when it loaded the model, else how to load it on demand.
    _transformers: Any = field(default=None, repr=False, compare=False)
    _tokenizer_source: tuple[str, bool] | None = field(default=None, repr=False, compare=False)

    @cached_property
    def identity(self) -> bytes:
        """A digest of what makes the model's ids mean what they do: its whole tokenizer, chat
        template, type, context length and served name (stream states are bound to it)."""
        info = self.info
        digest = hashlib.blake2b(digest_size=16, person=b"rs.model")
        for part in (
            self.tokenizer_bytes(),
            (info.chat_template or "").encode(),
            info.model_type.encode(),
            str(info.max_model_len).encode(),
            info.served_model_name.encode(),
        ):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return digest.digest()

    @cached_property
    def special_tokens_map(self) -> dict[str, Any]:
        """The tokenizer's special tokens by role (``eos_token``, ...): chat templates see them."""
        if self.hf is None:
            return {}
        return dict(self.hf.special_tokens_map)

    @cached_property
    def hf_tokenizer(self) -> Any:
        """transformers' tokenizer (None in Mistral mode). A model loaded without transformers
        loads it here on first use: only tests and tools ask, never the render path."""
        if self._transformers is not None or self._tokenizer_source is None:
            return self._transformers
        path, trust_remote_code = self._tokenizer_source
        return _transformers_tokenizer(Path(path), trust_remote_code)

    def tokenizer_bytes(self) -> bytes:
        """The whole tokenizer as bytes (the HF tokenizer's JSON, or every tekken token)."""
        mistral = self.mistral
        if mistral is not None:
            return msgspec.msgpack.encode([mistral.version, mistral.token_bytes])
        return self.hf_backend.to_str().encode()

    @property
    def vocab_size(self) -> int:
        if self.mistral is not None:
            return self.mistral.vocab_size
        return int(self.hf_backend.get_vocab_size(with_added_tokens=True))

    @property
    def _hf(self) -> HFTokenizer:
        if self.hf is None:
            raise RuntimeError(
                "this model has no Hugging Face tokenizer (--tokenizer-mode mistral)"
            )
        return self.hf

    @property
    def hf_backend(self) -> tokenizers.Tokenizer:
        """The fast HF tokenizer (not in Mistral mode)."""
        if self.backend is None:
            raise RuntimeError(
                "this model has no Hugging Face tokenizer (--tokenizer-mode mistral)"
            )
        return self.backend

    def added_tokens(self) -> dict[str, int]:
        if self.mistral is not None:
            return self.mistral.control_tokens()
        return {
            tok.content: tok_id
            for tok_id, tok in self.hf_backend.get_added_tokens_decoder().items()
        }

    def special_ids(self) -> frozenset[int]:
        if self.mistral is not None:
            return self.mistral.special_ids
        return frozenset(self._hf.all_special_ids) | frozenset(
            tok_id
            for tok_id, tok in self.hf_backend.get_added_tokens_decoder().items()
            if tok.special
        )

    def stream_special_ids(self) -> frozenset[int]:
        """The ids vLLM's incremental detokenizer skips with `skip_special_tokens`."""
        if self.mistral is not None:
            return self.mistral.dropped_ids
        return frozenset(self._hf.all_special_ids)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Ids of a prompt text (`add_special_tokens`: the tokenizer's BOS and the like)."""
        if self.mistral is not None:
            return self.mistral.encode(text, add_special_tokens)
        return list(self.hf_backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        if self.mistral is not None:
            return self.mistral.decode(ids, skip_special_tokens)
        return str(self.hf_backend.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_strs(self, ids: list[int]) -> list[str]:
        """Each id's own token string (`convert_ids_to_tokens`)."""
        if self.mistral is not None:
            return [self.mistral.piece(i) for i in ids]
        # transformers' convert_ids_to_tokens: the backend's id_to_token of each id (the ids of
        # an encode, so never unknown).
        backend = self.hf_backend
        return cast(list[str], [backend.id_to_token(int(i)) for i in ids])

    def known(self, token_id: int) -> bool:
        """Whether the id has a vocabulary entry."""
        if self.mistral is not None:
            return 0 <= token_id < self.mistral.vocab_size
        return self.hf_backend.id_to_token(token_id) is not None

    def stream_decoder(self, skip_special_tokens: bool) -> Callable[[Sequence[int]], str]:
        """The decode callable of the incremental detokenizer (special tokens kept)."""
        if self.mistral is not None:
            return self.mistral.stream_decoder(skip_special_tokens)
        backend = self.hf_backend

        def decode(ids: Sequence[int]) -> str:
            # A tuple or list goes as it is (the detokenizer's windows are tuples; converting
            # them took a third of the call).
            if not isinstance(ids, (tuple, list)):
                ids = list(ids)
            return str(backend.decode(ids, skip_special_tokens=False))

        return decode

    def check_name(self, name: str | None) -> None:
        """ModelNotFound (404) unless ``name`` is absent or the served model name."""
        served = self.info.served_model_name
        if name is not None and name != served:
            raise ModelNotFound(
                f"The model `{name}` does not exist. Valid aliases: {served}.", "model"
            )


def load_model(
    model: str,
    *,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    chat_template: str | None = None,
    tokenizer: str | None = None,
    revision: str | None = None,
    tokenizer_revision: str | None = None,
    trust_remote_code: bool = False,
    generation_config: str = "auto",
    tokenizer_mode: str = "auto",
) -> Model:
    """Load a model directory (or an offline hub id) the way vLLM's render server does.

    The tokenizer and its chat template come from ``tokenizer`` when given (vLLM's
    ``--tokenizer``), the configuration from ``model``; sampling defaults from the model's
    generation_config.json ("auto"), from none ("vllm"), or from another directory. With
    ``tokenizer_mode`` "mistral" the tokenizer is that directory's tekken.json.
    """
    path = resolve_model_path(model, revision)
    tokenizer_path = (
        resolve_model_path(tokenizer, tokenizer_revision or revision, "--tokenizer")
        if tokenizer is not None
        else path
    )
    config = read_json(path / "config.json")
    tokenizer_config = read_json(tokenizer_path / "tokenizer_config.json")
    generation = _generation_config(path, generation_config)
    mistral: MistralTokenizer | None = None
    hf: HFTokenizer | None = None
    transformers_tokenizer: Any = None
    eos_token_id: int | None
    bos_token_id: int | None
    if tokenizer_mode == "mistral":
        mistral = MistralTokenizer.from_directory(tokenizer_path)
        eos_token_id, bos_token_id = mistral.eos_token_id, mistral.bos_token_id
    else:
        if not trust_remote_code:
            tokenizer_model_type = read_json(tokenizer_path / "config.json").get("model_type")
            hf = load_without_transformers(
                tokenizer_path,
                tokenizer_config,
                tokenizer_model_type if isinstance(tokenizer_model_type, str) else None,
            )
        if hf is None:
            transformers_tokenizer = _transformers_tokenizer(tokenizer_path, trust_remote_code)
            hf = HFTokenizer.from_transformers(transformers_tokenizer)
        eos_token_id, bos_token_id = hf.eos_token_id, hf.bos_token_id
    derived_len = _max_model_len(config)
    if max_model_len is not None and max_model_len > derived_len:
        raise InvalidRequest(
            f"--max-model-len {max_model_len} is larger than the model's context length {derived_len}"
        )
    template = (
        chat_template
        if chat_template is not None
        else _load_chat_template(tokenizer_path, tokenizer_config)
    )
    if mistral is not None:
        template = None  # Mistral's own request format, not a chat template
    eos_ids = _as_ids(generation.get("eos_token_id")) or _as_ids(config.get("eos_token_id"))
    info = ModelInfo(
        path=str(path),
        served_model_name=served_model_name or model,
        model_type=str(config.get("model_type", "")),
        max_model_len=max_model_len or derived_len,
        sampling_defaults={
            ours: generation[theirs_key]
            for theirs_key, ours in _SAMPLING_KEYS.items()
            if generation.get(theirs_key) is not None
        },
        eos_token_id=eos_token_id,
        eos_token_ids=eos_ids,
        bos_token_id=bos_token_id,
        chat_template=template,
    )
    if mistral is not None:
        return Model(info=info, hf=None, backend=None, mistral=mistral)
    assert hf is not None
    backend = hf.backend
    harmony = None
    if info.model_type in HARMONY_MODEL_TYPES:
        harmony = HarmonyEncoder.load(
            lambda text: backend.encode(text, add_special_tokens=False).ids
        )
    return Model(
        info=info,
        hf=hf,
        backend=backend,
        harmony=harmony,
        _transformers=transformers_tokenizer,
        _tokenizer_source=(str(tokenizer_path), trust_remote_code),
    )


def _transformers_tokenizer(path: Path, trust_remote_code: bool) -> Any:
    """``AutoTokenizer.from_pretrained`` as vLLM calls it (offline)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        str(path), local_files_only=True, trust_remote_code=trust_remote_code
    )
