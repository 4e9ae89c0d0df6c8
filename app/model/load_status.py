"""The lines under the Model pane's buttons while and after a model loads: the progress bar, the load's stage, the
native decode step's build, and why a load failed.

Each line takes room only while it has something to say, so the pane fits a 768-pixel-high screen with a model
loaded. The build line follows :class:`~app.bridge.types.NativeBuild`: the engine builds its native decode step in
the background the first time it runs on a machine (minutes of compiling), and the model answers meanwhile without
it; the line says so, then says when the step is ready or why it is not.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QProgressBar, QVBoxLayout, QWidget

from app.bridge.types import NativeBuild
from app.model.load_stage import native_build_text

#: The build line's look while the step builds or once it is ready, and when it could not be built.
_QUIET = "QLabel { color: #8a8a8a; }"
_FAILED = "QLabel { color: #8a4b00; }"


class LoadStatus(QWidget):
    """The progress bar and the stage, build and error lines; the pane sets them, this shows or hides them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.progress = QProgressBar()
        self.progress.setObjectName("modelLoadProgress")
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.setMaximumHeight(8)
        self.stage_label = QLabel()
        self.stage_label.setObjectName("modelStageLabel")
        self.stage_label.hide()
        self.build_label = QLabel()
        self.build_label.setObjectName("nativeBuildLabel")
        self.build_label.setWordWrap(True)
        self.build_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.build_label.hide()
        self.error_label = QLabel()
        self.error_label.setObjectName("modelErrorLabel")
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_label.setStyleSheet(
            "QLabel { color: #b71c1c; background: #fdecea; border: 1px solid #f5c2c0;"
            " border-radius: 4px; padding: 6px; }")
        self.error_label.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        for widget in (self.progress, self.stage_label, self.build_label, self.error_label):
            layout.addWidget(widget)

    def set_stage(self, text: str) -> None:
        """The load's stage, or no line."""
        self.stage_label.setText(text)
        self.stage_label.setVisible(bool(text))

    def show_build(self, build: NativeBuild | None, precision: str = "") -> None:
        """The native decode step's build as the model in use (running at ``precision``) meets it; None: no line."""
        text = native_build_text(build, precision) if build is not None else ""
        self.build_label.setText(text)
        self.build_label.setStyleSheet(_FAILED if build is not None and build.state == "failed" else _QUIET)
        self.build_label.setVisible(bool(text))
