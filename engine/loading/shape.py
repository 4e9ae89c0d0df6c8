"""A model's shape checked before any weight is read: against its weights, and against itself.

Hugging Face folders (``config.json``) and GGUF files (their metadata, under config.json's names) pass through the
same two checks, from ``engine/loading/validate.py``: :func:`check_dimensions` (the layer count, hidden size and
head counts that the weights in the file can back) and :func:`check_config_values` (sizes, heads, head size,
epsilons, rope and vocabulary that a model can run with). A config that fails them would load and then fail every
request (or divide by zero, or index past the embedding), so it is refused at load, in words.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from engine.api import ModelLoadError
from engine.architectures import ARCHITECTURES

#: The shortest context a model may have: a chat prompt's template alone takes more tokens than this.
MIN_CONTEXT = 16
_LAYER_INDEX = re.compile(r"\.(\d+)\.")
#: Sizes that must be positive whole numbers where a config gives them.
SIZE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
             "head_dim", "vocab_size", "max_position_embeddings")  # fmt: skip
#: Numbers that must be positive and finite where a config gives them (a NaN epsilon makes every output NaN).
POSITIVE_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta", "partial_rotary_factor")


def _show(value: Any) -> str:
    return repr(value)[:40] if not isinstance(value, str) else repr(value[:40])


def layers_present(names: Iterable[str]) -> int | None:
    """How many layers the tensor names number (distinct first index: ``model.layers.N.``, ``blk.N.``, ``h.N.``),
    or None when no name carries an index."""
    indices = {int(m.group(1)) for m in map(_LAYER_INDEX.search, names) if m is not None and len(m.group(1)) < 10}
    return len(indices) if indices else None


def check_dimensions(
    sizes: Mapping[str, Any], where: Path, num_elements: int, layers: int | None, advice: str
) -> None:
    """Refuse a layer count, hidden size or head count that the weights in the file cannot back.

    Every layer holds at least ``hidden_size`` weights (its norm), so ``layers x hidden_size`` cannot exceed
    the weights present, and the layers cannot outnumber the layer indices the tensor names carry. Checked
    before anything is built: a skeleton of 10^6 layers would take minutes before any weight is compared.

    Args:
        sizes: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``num_key_value_heads`` (absent
            or None: not checked).
        where: The model, for the message.
        num_elements: Weights in the file(s).
        layers: Distinct layer indices in the tensor names (:func:`layers_present`), None when unknown.
        advice: What to do, ending the message.
    """
    values: dict[str, int] = {}
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads"):
        value = sizes.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelLoadError(f"{where} is corrupt: its {key} is {_show(value)}, not a positive whole "
                                 f"number. {advice}")  # fmt: skip
        values[key] = value
    n_layers, hidden = values.get("num_hidden_layers"), values.get("hidden_size")
    heads, kv_heads = values.get("num_attention_heads"), values.get("num_key_value_heads")
    problem = ""
    if n_layers is not None and layers is not None and n_layers > layers:
        problem = f"it claims {n_layers} layers but its tensors hold {layers}"
    elif n_layers is not None and n_layers * (hidden or 1) > num_elements:
        problem = f"it claims {n_layers} layers of width {hidden or 1}, more than its {num_elements} weights can hold"
    elif hidden is not None and hidden > num_elements:
        problem = f"it claims a hidden size of {hidden}, more than its {num_elements} weights"
    elif heads is not None and hidden is not None and heads > hidden:
        problem = f"it claims {heads} attention heads for a hidden size of {hidden}"
    elif kv_heads is not None and heads is not None and kv_heads > heads:
        problem = f"it claims {kv_heads} key/value heads but only {heads} attention heads"
    if problem:
        raise ModelLoadError(f"{where} does not match its weights: {problem}. {advice}")


def check_config_values(
    config: Mapping[str, Any], where: Path, advice: str, tokenizer_size: int | None = None
) -> None:
    """Refuse a config that describes a model no engine can run, saying what is wrong.

    Sizes must be positive whole numbers and epsilons, rope bases and factors positive finite numbers (a rope base
    at least 1); the
    attention heads must divide the hidden size (unless the config gives the head size), the key/value heads must
    divide the attention heads, the rotary part of a head must have an even size, and the vocabulary must hold every
    token of the tokenizer (``tokenizer_size``: its highest id + 1, where known before loading).

    Args:
        config: config.json's fields (a GGUF's metadata under the same names).
        where: The model, for the message.
        advice: What to do, ending the message.
        tokenizer_size: Tokens the tokenizer can produce (ids below it), None when not known yet.
    """
    sizes: dict[str, int] = {}
    for key in SIZE_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelLoadError(
                f"{where} is corrupt: its {key} is {_show(value)}, not a positive whole number. {advice}"
            )
        sizes[key] = value
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        raise ModelLoadError(f"{where} is corrupt: its rope settings are {_show(rope)}, not a JSON object. {advice}")
    numbers = {key: config.get(key) for key in POSITIVE_KEYS}
    numbers |= {f"rope {key}": rope.get(key) for key in ("rope_theta", "factor")}
    for key, value in numbers.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ModelLoadError(
                f"{where} is corrupt: its {key} is {_show(value)}, not a positive finite number. {advice}"
            )
    for key in ("rope_theta", "rope rope_theta"):  # base ** -1 is the first position frequency: a tiny base overflows
        base = numbers[key]
        if base is not None and base < 1:
            raise ModelLoadError(
                f"{where} is corrupt: its {key} (the rotary base) is {_show(base)}; a base under 1 makes the "
                f"position frequencies overflow (models use 10,000 to a few million). {advice}"
            )
    hidden, heads = sizes.get("hidden_size"), sizes.get("num_attention_heads")
    kv_heads, vocab = sizes.get("num_key_value_heads"), sizes.get("vocab_size")
    arch = ARCHITECTURES.get(str(config.get("model_type", "")))
    head_dim = sizes.get("head_dim") or (arch.head_dim if arch is not None else None)
    problem = ""
    if heads is not None and hidden is not None and head_dim is None and hidden % heads:
        problem = f"its {heads} attention heads do not divide its hidden size of {hidden}"
    elif heads is not None and kv_heads is not None and kv_heads > heads:
        problem = f"it has more key/value heads ({kv_heads}) than attention heads ({heads})"
    elif heads is not None and kv_heads is not None and heads % kv_heads:
        problem = f"its {heads} attention heads are not a multiple of its {kv_heads} key/value heads"
    elif tokenizer_size is not None and vocab is not None and tokenizer_size > vocab:
        problem = (f"its tokenizer has {tokenizer_size} tokens but its vocabulary (the embedding) only {vocab}, so "
                   "some tokens have no embedding; the tokenizer and the weights come from different models")  # fmt: skip
    context = sizes.get("max_position_embeddings")
    if not problem and context is not None and context < MIN_CONTEXT:
        problem = f"its context holds {context} tokens, too few for any prompt (at least {MIN_CONTEXT})"
    if not problem and heads is not None and (head_dim is not None or hidden is not None):
        size = head_dim if head_dim is not None else (hidden or 0) // heads
        factor = numbers.get("partial_rotary_factor") or 1.0
        rotary = int(size * factor)
        if rotary % 2 or rotary == 0:
            problem = (f"its rotary head size is {rotary} (head size {size}); rotary position embeddings need an "
                       "even, non-zero one")  # fmt: skip
    if problem:
        raise ModelLoadError(f"{where} describes a model that cannot run: {problem}. {advice}")
