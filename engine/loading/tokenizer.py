"""A model folder's tokenizer over the ``tokenizers`` library, without importing transformers (a heavy import).

For a folder with a ``tokenizer.json`` whose ``tokenizer_config.json`` names the plain tokenizers-backed class
(:func:`is_plain`), :class:`Tokenizer` reads the same files transformers 5's ``TokenizersBackend`` reads, the same
way: special tokens from ``tokenizer_config.json`` (``special_tokens_map.json`` and ``added_tokens.json`` only when
the config has no ``added_tokens_decoder``), added tokens added to the backend as transformers adds them,
``add_bos_token``/``add_eos_token`` ignored (``tokenizer.json``'s post-processor decides), chat templates from
``chat_template.jinja`` and ``additional_chat_templates/`` before the config's. So ids, text and chat prompts are
transformers' (``tests/engine/loading/test_tokenizer.py`` compares them).

It offers the part of transformers' tokenizer API that Hearth uses: ``__call__``/``encode``/``decode``,
``apply_chat_template``, token/id conversion, the special tokens and their ids, ``get_vocab``, ``vocab_size``,
``len()``, ``added_tokens_decoder``, ``backend_tokenizer`` and ``chat_template``; templates render in
``engine/loading/chat_render.py``. Other folders load through transformers (:func:`engine.loading.native.load_tokenizer`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

from engine.loading.chat_render import apply_chat_template

#: Tokenizer classes that are the plain tokenizers-backed class (no per-model Python behaviour).
PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
#: The named special tokens transformers knows (models may name more, e.g. ``image_token``).
SPECIAL_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def is_plain(folder: Path) -> bool:
    """Whether :class:`Tokenizer` loads this folder exactly as transformers would."""
    config = _read_json(folder / "tokenizer_config.json")
    return (
        (folder / "tokenizer.json").is_file()
        and config.get("tokenizer_class") in PLAIN_CLASSES
        and "fast_tokenizer_files" not in config
        and "auto_map" not in config
    )


def _added(value: Any, special: bool | None = None) -> tokenizers.AddedToken:
    """A config's token entry (a string, or a dict of AddedToken fields) as an AddedToken."""
    if isinstance(value, tokenizers.AddedToken):
        return value
    if isinstance(value, str):
        return tokenizers.AddedToken(value, special=True if special is None else special)
    fields = {k: v for k, v in value.items() if k not in ("__type", "id") and (special is None or k != "special")}
    return tokenizers.AddedToken(**fields) if special is None else tokenizers.AddedToken(**fields, special=special)


def _named(value: Any) -> Any:
    """A special token as the config gives it: a string, or a serialized AddedToken (a dict) made one."""
    return _added(value, None) if isinstance(value, dict) else value


def _token_text(value: Any) -> str:
    return str(value.content if isinstance(value, tokenizers.AddedToken) else value)


class Tokenizer:
    """A ``tokenizers.Tokenizer`` with its folder's special tokens, chat template and decoding settings."""

    is_fast = True

    def __init__(self, folder: Path) -> None:
        config = _read_json(folder / "tokenizer_config.json")
        for key in ("tokenizer_class", "init_inputs", "add_bos_token", "add_eos_token"):
            config.pop(key, None)
        self.name_or_path = str(folder)
        self.chat_template = self._chat_templates(folder, config.pop("chat_template", None))
        backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        if backend.padding is not None:
            config.setdefault("pad_token", backend.padding["pad_token"])
            config.setdefault("padding_side", backend.padding["direction"])
        backend.no_truncation()  # transformers' __call__ switches both off unless asked
        backend.no_padding()
        if backend.post_processor is None:
            backend.post_processor = tokenizers.processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1")
        self._backend = backend
        self._lock = threading.Lock()  # encode_special_tokens is switched per call

        if "additional_special_tokens" in config and not config.get("extra_special_tokens"):
            config["extra_special_tokens"] = config.pop("additional_special_tokens")
        # model-specific special tokens (``image_token``...) are the config's other string-valued ``*_token`` keys
        specific = {k: v for k, v in config.items()
                    if k.endswith("_token") and k not in SPECIAL_ATTRIBUTES and isinstance(v, str)}  # fmt: skip
        decoder: dict[int, tokenizers.AddedToken] = {}
        if isinstance(config.get("added_tokens_decoder"), dict):
            decoder = {int(i): _added(t, None) for i, t in config["added_tokens_decoder"].items()}
        else:
            self._legacy_tokens(folder, config, decoder)
        extra = config.get("extra_special_tokens") or []
        if isinstance(extra, dict):
            specific.update(extra)
            extra = []
        #: named special tokens (str or AddedToken): transformers' seven, then the model-specific ones
        self._special: dict[str, Any] = {k: _named(config[k]) for k in SPECIAL_ATTRIBUTES if config.get(k) is not None}
        self._special.update({k: _named(v) for k, v in specific.items()})
        self._extra: list[Any] = [_named(t) for t in extra]
        self._add_config_tokens(decoder)

        self.padding_side: str = config.get("padding_side", "right")
        self.model_max_length = config.get("model_max_length", int(1e30))
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self._clean_bpe = bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"))
        self.split_special_tokens = bool(config.get("split_special_tokens", False))
        self._backend.encode_special_tokens = self.split_special_tokens

    @staticmethod
    def _chat_templates(folder: Path, from_config: Any) -> str | dict[str, str] | None:
        """``chat_template.jinja`` and ``additional_chat_templates/*.jinja`` win over the config's template(s)."""
        templates: dict[str, str] = {}
        if (folder / "chat_template.jinja").is_file():
            templates["default"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        extra_dir = folder / "additional_chat_templates"
        if extra_dir.is_dir():
            for file in sorted(extra_dir.glob("*.jinja")):
                templates[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
        if len(templates) == 1 and "default" in templates:
            return templates["default"]
        if templates:
            return templates
        if isinstance(from_config, (list, tuple)):
            return {t["name"]: t["template"] for t in from_config}
        return from_config if isinstance(from_config, (str, dict)) else None

    def _legacy_tokens(self, folder: Path, config: dict[str, Any], decoder: dict[int, tokenizers.AddedToken]) -> None:
        """A config without ``added_tokens_decoder``: special_tokens_map.json, added_tokens.json, tokenizer.json."""
        for key, value in _read_json(folder / "special_tokens_map.json").items():
            if isinstance(value, dict) and key != "extra_special_tokens":
                value = _added(value, special=True)
            elif key == "extra_special_tokens" and isinstance(value, list):
                existing = list(config.get("extra_special_tokens") or [])
                existing += [t for t in (_added(v, True) if isinstance(v, dict) else v for v in value) if t not in existing]
                value = existing
            config[key] = value
        named = {_token_text(_named(config[k])) for k in SPECIAL_ATTRIBUTES if config.get(k)}
        named.update(_token_text(_named(t)) for t in (config.get("extra_special_tokens") or []))
        for text, index in _read_json(folder / "added_tokens.json").items():
            special = text in named
            decoder[int(index)] = tokenizers.AddedToken(text, rstrip=False, lstrip=False, normalized=not special,
                                                        special=special)  # fmt: skip
        for entry in _read_json(folder / "tokenizer.json").get("added_tokens", []):
            decoder[int(entry["id"])] = _added(entry, None)

    def _add_config_tokens(self, decoder: dict[int, tokenizers.AddedToken]) -> None:
        """Add the config's added tokens and any special token the backend lacks, as transformers' __init__ does."""
        to_add: list[Any] = [decoder[i] for i in sorted(decoder)]
        known = {t.content for t in self._backend.get_added_tokens_decoder().values()}
        known.update(t.content for t in to_add)
        for value in [*self._special.values(), *self._extra]:
            if _token_text(value) not in known:
                to_add.append(value)
                known.add(_token_text(value))
        named = {_token_text(v) for v in self._special.values()}
        tokens = []
        for token in to_add:
            if isinstance(token, str):
                token = tokenizers.AddedToken(token, special=True)
            elif isinstance(token, dict):
                token = _added(token, None)
            if not token.special and token.content in named:
                token.special = True
            tokens.append(token)
        if tokens:
            self._backend.add_tokens(tokens)

    # --- vocabulary and special tokens ---------------------------------------------------------------------------
    @property
    def backend_tokenizer(self) -> tokenizers.Tokenizer:
        return self._backend

    @property
    def vocab_size(self) -> int:
        """The base vocabulary's size, without added tokens."""
        return int(self._backend.get_vocab_size(with_added_tokens=False))

    def __len__(self) -> int:
        return int(self._backend.get_vocab_size(with_added_tokens=True))

    def __bool__(self) -> bool:
        return True

    def get_vocab(self) -> dict[str, int]:
        return dict(self._backend.get_vocab(with_added_tokens=True))

    @property
    def added_tokens_decoder(self) -> dict[int, tokenizers.AddedToken]:
        return dict(self._backend.get_added_tokens_decoder())

    def __getattr__(self, name: str) -> Any:
        """``bos_token``/``bos_token_id`` and the like: the text (or id) of a named special token, None when unset."""
        key = name.removesuffix("_id")
        special = self.__dict__.get("_special")
        if special is None or not key.endswith("_token") or (key not in SPECIAL_ATTRIBUTES and key not in special):
            raise AttributeError(f"{type(self).__name__} has no attribute {name}")
        value = special.get(key)
        if value is None:
            return None
        return self.convert_tokens_to_ids(_token_text(value)) if name != key else _token_text(value)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        return {k: _token_text(v) for k, v in self._special.items()}

    @property
    def extra_special_tokens(self) -> list[str]:
        return [_token_text(t) for t in self._extra]

    @property
    def all_special_tokens(self) -> list[str]:
        seen: dict[str, None] = {}
        for value in [*self._special.values(), *self._extra]:
            seen.setdefault(_token_text(value))
        return list(seen)

    @property
    def all_special_ids(self) -> list[int]:
        return [int(i) for i in self.convert_tokens_to_ids(self.all_special_tokens) if i is not None]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        """The id of a token (or ids of tokens); the unknown token's id (or None) for a token not in the vocabulary."""
        if isinstance(tokens, str):
            index = self._backend.token_to_id(tokens)
            unk = self._special.get("unk_token")
            return index if index is not None or unk is None else self._backend.token_to_id(_token_text(unk))
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> Any:
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in skip]

    # --- encoding and decoding ----------------------------------------------------------------------------------
    def _encode(self, texts: list[str], add_special_tokens: bool, split_special_tokens: bool | None) -> list[list[int]]:
        split = self.split_special_tokens if split_special_tokens is None else split_special_tokens
        with self._lock:
            self._backend.encode_special_tokens = split
            try:
                encodings = self._backend.encode_batch(texts, add_special_tokens=add_special_tokens)
            finally:
                self._backend.encode_special_tokens = self.split_special_tokens
        return [list(e.ids) for e in encodings]

    def __call__(
        self,
        text: str | Sequence[str],
        add_special_tokens: bool = True,
        split_special_tokens: bool | None = None,
        padding: bool | str = False,
        padding_side: str | None = None,
        return_tensors: str | None = None,
    ) -> dict[str, Any]:
        """``{"input_ids": ..., "attention_mask": ...}`` for one text (lists of ints) or a batch (lists of lists).

        ``padding=True`` pads a batch to its longest sequence with the pad token on ``padding_side`` (default
        :attr:`padding_side`); ``return_tensors="pt"`` returns torch tensors.
        """
        batched = not isinstance(text, str)
        ids = self._encode([text] if isinstance(text, str) else list(text), add_special_tokens, split_special_tokens)
        masks = [[1] * len(row) for row in ids]
        if padding not in (False, "do_not_pad") and len(ids) > 1:
            if padding not in (True, "longest"):
                raise ValueError(f"padding={padding!r} is not supported; use True or 'longest'")
            pad = self.pad_token_id
            if pad is None:
                raise ValueError("padding needs a pad token, and this tokenizer has none")
            width = max(len(row) for row in ids)
            left = (padding_side or self.padding_side) == "left"
            ids = [[pad] * (width - len(r)) + r if left else r + [pad] * (width - len(r)) for r in ids]
            masks = [[0] * (width - len(m)) + m if left else m + [0] * (width - len(m)) for m in masks]
        out: dict[str, Any] = {"input_ids": ids, "attention_mask": masks}
        if return_tensors == "pt":
            import torch

            return {k: torch.tensor(v, dtype=torch.long) for k, v in out.items()}
        if return_tensors is not None:
            raise ValueError(f"return_tensors={return_tensors!r} is not supported; use 'pt' or None")
        return out if batched else {k: v[0] for k, v in out.items()}

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool | None = None) -> list[int]:
        return self._encode([text], add_special_tokens, split_special_tokens)[0]

    def decode(
        self, token_ids: Any, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool | None = None
    ) -> Any:
        """Text of ids (an int, a list, a tensor, or ``{"input_ids": ...}``); a list of texts for a batch."""
        if isinstance(token_ids, Mapping):
            token_ids = token_ids["input_ids"]
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if token_ids and isinstance(token_ids[0], (list, tuple)):
            return [self.decode(row, skip_special_tokens, clean_up_tokenization_spaces) for row in token_ids]
        text = str(self._backend.decode([int(t) for t in token_ids], skip_special_tokens=skip_special_tokens))
        clean = self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None else clean_up_tokenization_spaces
        # transformers skips the clean-up for BPE models, where it would eat real spaces before punctuation
        if clean and (type(self._backend.model).__name__ != "BPE" or self._clean_bpe):
            for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                                  (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):  # fmt: skip
                text = text.replace(before, after)
        return text

    # --- chat templates -----------------------------------------------------------------------------------------
    def get_chat_template(self, chat_template: str | None = None, tools: list[dict[str, Any]] | None = None) -> str:
        """The template to render: a named one of several, the default, or the one given."""
        if isinstance(self.chat_template, dict):
            named = self.chat_template
            if chat_template is not None and chat_template in named:
                return named[chat_template]
            if chat_template is None:
                if tools is not None and "tool_use" in named:
                    return named["tool_use"]
                if "default" in named:
                    return named["default"]
                raise ValueError(f"this model has several chat templates and none is the default: {sorted(named)}")
        if chat_template is None:
            if self.chat_template is None:
                raise ValueError("this tokenizer has no chat template (tokenizer.chat_template is not set)")
            return str(self.chat_template)
        return chat_template

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        return_dict: bool = True,
        **kwargs: Any,
    ) -> Any:
        """One conversation through the chat template, as transformers renders it: text, ids or
        ``{"input_ids", "attention_mask"}`` (``tokenize``/``return_dict``). Other keywords reach the template."""
        text = apply_chat_template(self, conversation, tools, documents, chat_template, add_generation_prompt,
                                   continue_final_message, tokenize=False, **kwargs)  # fmt: skip
        if not tokenize:
            return text
        out = self(str(text), add_special_tokens=False)
        return out if return_dict else out["input_ids"]

    def __repr__(self) -> str:
        return f"Tokenizer(name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size}, len={len(self)})"


__all__ = ["PLAIN_CLASSES", "Tokenizer", "is_plain"]
