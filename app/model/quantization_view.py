"""The advice under the model pane's "Precision" choice: what fits and why, and a warning when the choice won't.

The reason behind a recommendation runs to several lines (the memory it was judged by, the file's own blocks); it
waits behind a "Why?" link (and in the tooltip), so the model pane fits a 768-pixel-high screen with a model loaded.
"""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.bridge.types import QuantizationAdvice
from app.formatting import format_bytes


def level_name(level: str) -> str:
    """A quantization level as the user reads it (the old name "none" is fp32)."""
    return "fp32" if level == "none" else level


#: The link under a recommendation that shows (or hides) its reason.
WHY_HREF = "why"


def describe_recommendation(rec: Any, *, is_reason_shown: bool = True) -> str:
    """Rich text for an ``engine.api.Recommendation``: the level, the numbers and the reason (or, folded, a "Why?"
    link to it)."""
    numbers = (f"weights {format_bytes(rec.weights_bytes)} · KV cache {format_bytes(rec.kv_bytes_per_token)} "
               f"per token ({format_bytes(rec.kv_budget_bytes)} for {rec.context_length} tokens) · "
               f"{format_bytes(rec.free_bytes)} free · fits: {html.escape(str(rec.fits))}")
    head = (f"Recommended precision: <b>{html.escape(level_name(rec.quantization))}</b> on "
            f"{html.escape(str(rec.device))}<br>{numbers}")
    if not is_reason_shown:
        return f"{head} · <a href='{WHY_HREF}'>Why?</a>"
    return (f"{head} · <a href='{WHY_HREF}'>Hide why</a><br>"
            f"<span style='color: #8a8a8a'>{html.escape(str(rec.reason))}</span>")


def fit_warning(rec: Any) -> str:
    """A plain warning when the level in ``rec`` will not fit (or only just), else ""."""
    name = level_name(rec.quantization)
    need = rec.weights_bytes + rec.kv_budget_bytes
    if rec.fits == "no":
        return f"{name} needs {format_bytes(need)} but only {format_bytes(rec.free_bytes)} is free — it will not fit."
    if rec.fits == "tight":
        return f"{name} needs {format_bytes(need)} of the {format_bytes(rec.free_bytes)} free — it fits, but only just."
    return ""


class QuantizationView(QWidget):
    """The recommendation for the chosen model and device, and a warning when the chosen level won't fit.

    The model pane asks the bridge for a :class:`QuantizationAdvice` and hands it over with
    :meth:`show_advice`; :meth:`update_warning` follows the level the user picks.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._advice: QuantizationAdvice | None = None
        self._is_reason_shown = False
        self._recommendation_label = QLabel("")
        self._recommendation_label.setObjectName("recommendationLabel")
        self._recommendation_label.setWordWrap(True)
        self._recommendation_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                                           | Qt.TextInteractionFlag.LinksAccessibleByMouse)
        self._recommendation_label.linkActivated.connect(self._on_link_activated)
        self._warning_label = QLabel("")
        self._warning_label.setObjectName("quantizationWarning")
        self._warning_label.setWordWrap(True)
        self._warning_label.setStyleSheet(
            "QLabel { color: #8a4b00; background: #fff4e5; border: 1px solid #ffd8a8;"
            " border-radius: 4px; padding: 6px; }")
        self._warning_label.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._recommendation_label)
        layout.addWidget(self._warning_label)

    @property
    def advice(self) -> QuantizationAdvice | None:
        """The advice shown; None while it is asked for (or before)."""
        return self._advice

    @property
    def is_reason_shown(self) -> bool:
        """Whether the recommendation's reason is unfolded under its numbers."""
        return self._is_reason_shown

    def show_estimating(self) -> None:
        """Drop the advice shown, saying a new one is on its way."""
        self._advice = None
        self.update_warning("")
        self._recommendation_label.setText("Estimating the memory this model needs…")
        self._recommendation_label.setToolTip("")

    def show_advice(self, advice: QuantizationAdvice) -> None:
        """Show the recommended level and its numbers (its reason as folded as before), or why there is none."""
        self._advice = advice
        rec = advice.recommendation
        if rec is None:
            self._recommendation_label.setText(
                f"<span style='color: #8a8a8a'>No recommendation: {html.escape(advice.error)}</span>")
            self._recommendation_label.setToolTip("")
        else:
            self._recommendation_label.setText(describe_recommendation(rec, is_reason_shown=self._is_reason_shown))
            self._recommendation_label.setToolTip(str(rec.reason))

    def set_reason_shown(self, is_shown: bool) -> None:
        """Unfold (or fold) the recommendation's reason under its numbers."""
        self._is_reason_shown = is_shown
        if self._advice is not None:
            self.show_advice(self._advice)

    @Slot(str)
    def _on_link_activated(self, href: str) -> None:
        if href == WHY_HREF:
            self.set_reason_shown(not self._is_reason_shown)

    def update_warning(self, level: str) -> None:
        """Warn when ``level`` will not fit (or only just), by the advice shown; else hide the warning."""
        rec = self._advice.estimates.get(level) if self._advice is not None else None
        warning = fit_warning(rec) if rec is not None else ""
        self._warning_label.setText(warning)
        self._warning_label.setVisible(bool(warning))
