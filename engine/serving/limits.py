"""Caps on what one request may ask of the shared engine, so that one client cannot slow every other stream.

A logit bias and stop strings are applied on the engine's thread at every step of the request, while it is
batched with everyone else's; without a cap, a request with 200 000 biases or 10 000 stop strings slowed the
other streams many times over. The caps are above what OpenAI's own API accepts (300 biases, 4 stop strings),
so a client written for it never meets them. A request over a cap is a 400 naming the field and the cap: OpenAI's bodies are refused while they are parsed
(``engine/serving/protocol.py``, before looping over the entries), Ollama's by :func:`check_sampling_limits`.
"""

from __future__ import annotations

from engine.api import SamplingParams
from engine.serving.protocol import (
    MAX_LOGIT_BIAS_ENTRIES,  # the most entries of logit_bias (OpenAI: 300)
    MAX_STOP_CHARS,  # the longest stop string: the reply's last this many characters are searched at each step
    MAX_STOP_STRINGS,  # the most stop strings (OpenAI: 4)
    APIError,
)

__all__ = ["MAX_LOGIT_BIAS_ENTRIES", "MAX_STOP_CHARS", "MAX_STOP_STRINGS", "check_sampling_limits"]


def check_sampling_limits(params: SamplingParams) -> None:
    """Refuse ``params`` whose logit biases or stop strings pass the caps above, with a 400 in words."""
    if len(params.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise APIError(400, f"logit_bias has {len(params.logit_bias)} entries; at most {MAX_LOGIT_BIAS_ENTRIES} "
                       "are accepted.", param="logit_bias", code="too_many_logit_biases")
    if len(params.stop) > MAX_STOP_STRINGS:
        raise APIError(400, f"stop has {len(params.stop)} strings; at most {MAX_STOP_STRINGS} are accepted.",
                       param="stop", code="too_many_stop_strings")
    longest = max((len(s) for s in params.stop), default=0)
    if longest > MAX_STOP_CHARS:
        raise APIError(400, f"A stop string is {longest} characters long; at most {MAX_STOP_CHARS} are accepted.",
                       param="stop", code="stop_string_too_long")
