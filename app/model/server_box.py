"""The model pane's "Serve on localhost" box: the OpenAI-compatible server's switch, port, key and state."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QWidget,
)

from app.bridge.engine_bridge import EngineBridge
from app.bridge.types import REMOTE_DEVICE, ServerState


class ServerBox(QGroupBox):
    """Serves the model loaded on this computer to other programs, through the bridge.

    Args:
        bridge: starts and stops the server, and reports its state.
    """

    def __init__(self, bridge: EngineBridge, parent: QWidget | None = None) -> None:
        super().__init__("Serve on localhost", parent)
        self._bridge = bridge
        self._serve_check = QCheckBox("Serve to programs on this computer (OpenAI API)")
        self._serve_check.setObjectName("serveCheck")
        self._serve_check.setToolTip("Serve the loaded model to other programs on this computer (OpenAI API). Only "
                                     "programs on this computer can connect (127.0.0.1).")
        self._serve_check.toggled.connect(self._on_serve_toggled)
        self._port_spin = QSpinBox()
        self._port_spin.setObjectName("servePortSpin")
        self._port_spin.setRange(1, 65535)
        self._port_spin.setValue(8000)
        self._key_edit = QLineEdit()
        self._key_edit.setObjectName("serveKeyEdit")
        self._key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self._key_edit.setToolTip("Optional: clients must send it as a Bearer token")
        self._key_edit.setPlaceholderText("Optional")
        self._status_label = QLabel("")  # empty while off: the switch's own words say it all
        self._status_label.setObjectName("serveStatusLabel")
        self._status_label.hide()
        self._status_label.setWordWrap(True)
        self._status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        address = QHBoxLayout()  # port and key on one line: the pane fits a laptop screen without scrolling
        address.addWidget(self._port_spin)
        address.addWidget(QLabel("API key"))
        address.addWidget(self._key_edit, 1)
        form = QFormLayout(self)
        form.addRow(self._serve_check)
        form.addRow("Port", address)
        form.addRow(self._status_label)
        self._bridge.signals.server_state_changed.connect(self._on_server_state_changed)

    def is_on(self) -> bool:
        """Whether serving is switched on (it runs while a local model is loaded)."""
        return self._serve_check.isChecked()

    def port(self) -> int:
        return self._port_spin.value()

    def restore(self, is_on: bool, port: int) -> None:
        """Put back the switch and port of the last session (serving starts with the next local model)."""
        self._port_spin.setValue(port)
        self._serve_check.setChecked(is_on)

    def start_if_on(self) -> None:
        """Start serving a model just loaded on this computer, if the user asked for it."""
        if self._serve_check.isChecked():
            self._bridge.start_server(self._port_spin.value(), self._key_edit.text())

    @Slot(bool)
    def _on_serve_toggled(self, checked: bool) -> None:
        info = self._bridge.model_info
        if not checked:
            self._bridge.stop_server()
        elif info is not None and info.device != REMOTE_DEVICE:
            self._show_status("Starting…")
            self._bridge.start_server(self._port_spin.value(), self._key_edit.text())
        else:
            self._show_status("Starts when a model is loaded on this computer.")

    @Slot(object)
    def _on_server_state_changed(self, state: ServerState) -> None:
        if state.is_running:
            key = " with the API key" if self._key_edit.text() else ""
            self._show_status(f"Serving at <b>{html.escape(state.url)}</b>{key}; "
                                       "chats here and API clients share the model.")
        elif self._serve_check.isChecked():
            self._show_status((state.message + " " if state.message else "")
                                       + "Serving starts again when a model is loaded on this computer.")
        else:
            self._show_status(state.message)

    def _show_status(self, text: str) -> None:
        """The line under the switch, or no line (the pane fits a laptop screen without scrolling)."""
        self._status_label.setText(text)
        self._status_label.setVisible(bool(text))
