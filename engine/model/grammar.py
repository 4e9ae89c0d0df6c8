"""Grammar-constrained decoding: which tokens may continue a valid document, through llguidance.

llguidance (the automaton behind llama.cpp's and vLLM's structured output) was picked over xgrammar and
outlines-core: it installs from PyPI on CPU with no dependencies (xgrammar pulls in triton), compiles a JSON schema
far faster than outlines-core builds its index for it, and computes each row's vocabulary-wide mask in Rust threads
that release the GIL, so the masks are made while the model computes the step (docs/BENCHMARKS.md).

:class:`GrammarCompiler` turns a request's ``SamplingParams`` into a :class:`Matcher` (caller's thread, at
submission). Each step, :func:`fill_masks` writes every constrained row's allowed tokens into one bitmask (the
engine runs it on a worker thread while the model computes the step's logits), and :func:`apply_masks` sets the
logits of every other token to -inf.
"""

from __future__ import annotations

import copy
import json
import threading
from typing import Any

import torch

from engine.api import SamplingParams
from engine.model.schema_check import check_schema

#: The JSON grammar's whitespace is compact, so a sampler cannot pad a document with spaces until it runs out of
#: tokens; ``json_object`` is any object.
_JSON_OPTIONS: Any = {"whitespace_flexible": False}
_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_CACHED_GRAMMARS = 32


def _limits() -> Any:
    """llguidance's resource limits, with its parser state kept out of error messages (a client reads them)."""
    from llguidance import LLParserLimits

    return LLParserLimits(verbose_errors=False)


class Matcher:
    """The state of one request's grammar: what may come next, and the tokens consumed so far."""

    def __init__(self, matcher: Any) -> None:
        self._m = matcher

    def accept(self, token: int) -> bool:
        """Advance over ``token``; False when the grammar does not allow it."""
        return bool(self._m.consume_token(token))

    @property
    def is_finished(self) -> bool:
        """The document is complete and nothing may follow."""
        return bool(self._m.is_stopped())

    @property
    def error(self) -> str | None:
        return str(self._m.get_error()) if self._m.is_error() else None


class GrammarCompiler:
    """Compiles grammars for one tokenizer. The tokenizer's automaton is built once, on first use: it spans the
    whole vocabulary, so building it is the costly part, and every grammar shares it."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos_ids = sorted(eos_ids)
        self._ll_tokenizer: Any = None
        self._executor: Any = None
        self._lock = threading.Lock()
        self._texts: dict[str, str] = {}

    def _ll(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance

                # what llguidance.hf.from_tokenizer does, for HF's fast tokenizers and engine/loading/tokenizer.py's
                # alike: llguidance reads the Rust tokenizer's JSON (without padding or truncation)
                backend = getattr(self._tokenizer, "backend_tokenizer", None)
                if backend is None:
                    raise ValueError("structured output needs a fast tokenizer (a tokenizer.json)")
                backend = copy.copy(backend)
                backend.no_padding()
                backend.no_truncation()
                self._ll_tokenizer = llguidance.LLTokenizer(
                    backend.to_str(), n_vocab=self.vocab_size, eos_token=self._eos_ids or None
                )
                self._executor = llguidance.LLExecutor()
            return self._ll_tokenizer

    def grammar_text(self, params: SamplingParams) -> str:
        """llguidance's grammar for ``params``; ``ValueError`` for a schema or grammar it cannot take.
        The last few are cached: ``n`` sequences, or a client repeating its schema, compile it once."""
        key = params.grammar if params.grammar is not None else json.dumps(params.json_schema, sort_keys=True)
        text = self._texts.get(key)
        if text is None:
            text = self._compile(params)
            if len(self._texts) >= _CACHED_GRAMMARS:
                self._texts.pop(next(iter(self._texts)))
            self._texts[key] = text
        return text

    def _compile(self, params: SamplingParams) -> str:
        from llguidance import LLMatcher

        if params.grammar is not None:
            text = LLMatcher.grammar_from_lark(params.grammar)
        else:
            schema = params.json_schema if params.json_schema is not None else _ANY_OBJECT
            check_schema(schema)
            text = LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=_JSON_OPTIONS)
        message = LLMatcher.validate_grammar(text, self._ll(), limits=_limits())
        if message:
            field = "grammar" if params.grammar is not None else "json_schema"
            raise ValueError(f"{field} cannot be used for constrained decoding: {message}")
        return text

    def matcher(self, params: SamplingParams) -> Matcher | None:
        """A fresh matcher for a constrained request, or None for free text."""
        if not params.is_constrained:
            return None
        from llguidance import LLMatcher

        text = self.grammar_text(params)  # first: a schema refused in words need not build the automaton
        matcher = LLMatcher(self._ll(), text, log_level=0, limits=_limits())
        if matcher.is_error():
            raise ValueError(f"the response format cannot be compiled: {matcher.get_error()}")
        return Matcher(matcher)

    def allocate(self, rows: int) -> torch.Tensor:
        """An int32 bitmask with room for ``rows`` rows of the vocabulary."""
        return torch.full((rows, (self.vocab_size + 31) // 32), -1, dtype=torch.int32)

    def fill_masks(self, matchers: list[Matcher]) -> torch.Tensor:
        """Every matcher's allowed tokens, one row each, computed in parallel (Rust threads, GIL released)."""
        bitmask = self.allocate(len(matchers))
        if matchers:
            from llguidance.torch import fill_next_token_bitmask_par

            self._ll()
            fill_next_token_bitmask_par(self._executor, [(m._m, i) for i, m in enumerate(matchers)], bitmask)
        return bitmask


_BITS = torch.arange(32, dtype=torch.int32)


def unpack_mask(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """A bool [vocab] tensor from one row of a packed int32 bitmask (True: the token is allowed)."""
    return ((bits.unsqueeze(-1) >> _BITS) & 1).bool().reshape(-1)[:vocab]


def apply_masks(logits: torch.Tensor, masks: list[torch.Tensor | None]) -> torch.Tensor:
    """``logits`` ([rows, vocab]) with each row's forbidden tokens at -inf; a None mask leaves its row alone.

    The masked rows are unpacked and filled in one pass, not one row at a time.
    """
    rows = [i for i, m in enumerate(masks) if m is not None]
    vocab = logits.shape[-1]
    bits = torch.stack([masks[i] for i in rows])  # type: ignore[misc]  # None filtered out above
    allowed = ((bits.unsqueeze(-1) >> _BITS) & 1).bool().reshape(len(rows), -1)[:, :vocab].to(logits.device)
    if allowed.shape[1] < vocab:  # a vocabulary wider than the grammar's: the rest is forbidden
        allowed = torch.cat([allowed, allowed.new_zeros(len(rows), vocab - allowed.shape[1])], dim=1)
    out = logits.clone()
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    out[index] = logits[index].masked_fill(~allowed, float("-inf"))
    return out
