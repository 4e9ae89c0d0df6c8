"""Incremental detokenization: text deltas that never split a UTF-8 character, with stop strings cut out."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decoding each token alone breaks multi-byte characters and drops the leading spaces some tokenizers
    encode in context, so it decodes a short window of earlier tokens with the new ones and emits the
    difference, holding back while the text ends in an incomplete character (U+FFFD). Text that could be the
    start of a stop string is also held back until it is known not to be one.
    """

    def __init__(self, tokenizer: Any, stop: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop or [])
        self._holdback = max((len(s) for s in self.stop), default=1) - 1
        self.token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""  # all decoded text so far (before stop-string truncation)
        self._emitted = 0  # characters of ``text`` already handed out
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def add(self, token_ids: list[int]) -> str:
        """Feed new tokens; return the text that is now safe to show."""
        if self.stopped:
            return ""
        self.token_ids.extend(token_ids)
        prefix = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
        full = self._decode(self.token_ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self.token_ids)
        return self._release(final=False)

    def finish(self) -> str:
        """Flush what was held back once the sequence has ended."""
        if not self.stopped:
            full = self._decode(self.token_ids[self._prefix_offset :])
            prefix = self._decode(self.token_ids[self._prefix_offset : self._read_offset])
            if len(full) > len(prefix):
                self.text += full[len(prefix) :].rstrip("\ufffd")
                self._prefix_offset = self._read_offset = len(self.token_ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stop and not self.stopped:
            start = max(0, self._emitted - self._holdback)
            hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.stopped = True
                final = True
        end = len(self.text) if final or self.stopped else max(self._emitted, len(self.text) - self._holdback)
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta

    @property
    def output_text(self) -> str:
        return self.text
