"""A chat's length in tokens as the model's chat template would send it, without tokenizing the whole chat again.

The context meter counts the chat after every reply and, while the user types, with the draft as its last turn.
Rendering and tokenizing a long chat through the template on every keystroke would grow with the chat; instead
each message's text is tokenized once (kept by its text), and the template's own tokens are measured once per
model on a few short probe chats: a fixed part (the start, a default system prompt some templates add, the
generation prompt) and a part per message (role markers, end-of-turn). The sum is exact for templates that wrap
each message the same way, as chat templates do; where the template cannot render the probes, or no tokenizer is at
hand (no local model, a remote server), a plain estimate of four characters a token stands in and says so.

Plain Python, no Qt: it runs on the meter's worker thread, one count at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

#: A model's tokenizer as the bridge lends it: a prompt (text, or messages through the chat template) to token ids.
Tokenize = Callable[[list[dict[str, str]] | str], list[int]]

#: The name of the thread the context meter counts on.
COUNT_THREAD = "hearth-context-meter"
#: Message texts whose counts are kept (the oldest go first): a long chat's messages and recent drafts.
MAX_CACHED = 4096
_PROBE = "hello"


def estimate_tokens(messages: Sequence[dict[str, str]]) -> int:
    """A rough count without a tokenizer: about four characters a token, plus a few per message."""
    return sum(len(m.get("content", "")) // 4 + 4 for m in messages)


class TokenCounter:
    """Counts chats with one model's tokenizer, which each call lends (it holds none, so it never keeps a model
    alive).

    Not thread-safe: one thread counts at a time (the meter's worker).
    """

    def __init__(self) -> None:
        self._tokenize: Tokenize | None = None
        self._cache: OrderedDict[str, int] = OrderedDict()
        # (fixed tokens without a system message, fixed tokens with one, tokens per message, specials per text)
        self._template: tuple[float, float, float, int] | None = None
        self._is_broken = False

    def count(self, messages: Sequence[dict[str, str]], tokenize: Tokenize | None, *,
              is_draft_last: bool = False) -> tuple[int, bool]:
        """Tokens of ``messages`` (oldest first) sent through the chat template, with the reply's opening; and
        whether ``tokenize`` gave them (False: an estimate, without a tokenizer or when it failed).

        With ``is_draft_last`` the last message is a draft being typed: counted, not kept (each keystroke makes
        another text, and a pasted one may be large)."""
        if tokenize is not None and not self._is_broken:
            self._tokenize = tokenize
            try:
                return (self._count(messages, is_draft_last) if messages else 0), True
            except Exception:  # noqa: BLE001 (a template or tokenizer that fails falls back to the estimate)
                self._is_broken = True
            finally:
                self._tokenize = None
        return estimate_tokens(messages), False

    def _count(self, messages: Sequence[dict[str, str]], is_draft_last: bool) -> int:
        base, base_with_system, per_message, _ = self._template or self._measure_template()
        fixed = base_with_system if messages[0].get("role") == "system" else base
        kept = messages[:-1] if is_draft_last else messages
        total = fixed + sum(self._text_tokens(m.get("content", "")) + per_message for m in kept)
        if is_draft_last:
            total += self._text_tokens(messages[-1].get("content", ""), keep=False) + per_message
        return max(round(total), 0)

    def _measure_template(self) -> tuple[float, float, float, int]:
        """The template's own tokens, from chats of the same probe text: with one message, three, and a system one.

        ``_text_tokens`` may count special tokens the tokenizer adds to any text (a BOS); they cancel out here. A
        user turn and a reply may cost a token apart ("user" and "assistant" tokenize differently): the part per
        message is their mean, kept as a fraction, so a chat, whose turns alternate, is off by a token at most.
        """
        assert self._tokenize is not None
        text = self._text_tokens(_PROBE)
        user, reply = {"role": "user", "content": _PROBE}, {"role": "assistant", "content": _PROBE}
        one = len(self._tokenize([user]))
        three = len(self._tokenize([user, reply, user]))
        with_system = len(self._tokenize([{"role": "system", "content": _PROBE}, user]))
        per_message = (three - one - 2 * text) / 2
        specials = max(2 * text - len(self._tokenize(f"{_PROBE} {_PROBE}")), 0)
        self._template = (one - text - per_message, with_system - 2 * (text + per_message), per_message, specials)
        return self._template

    def _text_tokens(self, text: str, keep: bool = True) -> int:
        """Tokens of ``text`` as the tokenizer counts a prompt of it (specials included), kept by text."""
        if not text:
            return self._template[3] if self._template else 0
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached
        assert self._tokenize is not None
        num = len(self._tokenize(text))
        if not keep:
            return num
        self._cache[text] = num
        if len(self._cache) > MAX_CACHED:
            self._cache.popitem(last=False)
        return num
