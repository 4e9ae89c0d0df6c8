"""The model card line under the Model pane's buttons: what is loaded, where, at which precision, in how much memory.

Plain text building (no widgets), so the pane shows the same line after a load and after a failed load that kept
the model in use.
"""

from __future__ import annotations

import html

from app.bridge.types import DEFAULT_MODEL_SPEC, REMOTE_DEVICE, ModelInfo
from app.formatting import format_bytes

#: The model card line's note on the bundled default model.
DEMO_NOTE = ("A small demo model: quick, but often wrong on facts. For real use, load a larger one from the "
             "Models tab or a path above.")


def model_card(info: ModelInfo) -> str:
    """The model card line: name, device (and why that one), precision, memory (weights and KV cache) and the load's
    time, and for the bundled default model a note that it is a small demo model."""
    if info.device == REMOTE_DEVICE:
        return f"<b>{html.escape(info.model_name)}</b> on <b>{html.escape(info.spec)}</b>"
    runs_on = f"runs on <b>{html.escape(info.device)}</b>"
    if info.device_reason:  # on the same line: the pane fits a laptop screen without scrolling
        runs_on += f" <span style='color: #8a8a8a'>({html.escape(info.device_reason.rstrip('.'))})</span>"
    details = [f"<b>{html.escape(info.model_name)}</b>", runs_on]
    precision = f"precision <b>{html.escape(info.precision)}</b>"
    if info.precision != info.dtype:  # quantized: its weights are int4 or int8, its arithmetic is not
        precision += f" (computes in {html.escape(info.dtype)})"
    details.append(precision)
    if info.weights_bytes:
        details.append(f"{format_bytes(info.weights_bytes)} of weights")
    if info.kv_cache_bytes:
        details.append(f"{format_bytes(info.kv_cache_bytes)} KV cache ({info.context_length} tokens per chat)")
    if info.load_s:
        details.append(f"loaded in {info.load_s:.1f} s")
    text = " · ".join(details)
    if info.spec == DEFAULT_MODEL_SPEC:
        text += f"<br><i>{html.escape(DEMO_NOTE)}</i>"
    return text
