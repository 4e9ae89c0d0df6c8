"""The bottom of the chat pane: the message box, its Send, Stop and Attach buttons, the attached files, the editing
banner and the context meter."""

from __future__ import annotations

from PySide6.QtCore import Signal, Slot
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMenu, QPushButton, QVBoxLayout, QWidget

from app.chat.attachments_bar import AttachmentsBar
from app.chat.chat_input import ChatInput
from app.chat.context_meter import ContextMeter


class Composer(QWidget):
    """Where the user writes a message. The chat pane decides what sending does and when it is allowed.

    While an earlier message is being edited, :attr:`editing_index` names it and the banner says so; the two
    change together in :meth:`set_editing`.

    Signals:
        send_requested(): Enter in the box, or Send.
        stop_requested(): Stop.
        attach_requested(): Attach → Files… (the chat pane asks which files).
        collections_requested(): Attach → Folder collections… (watched folders this chat may use).
        text_changed(): the box's text changed.
    """

    send_requested = Signal()
    stop_requested = Signal()
    attach_requested = Signal()
    collections_requested = Signal()
    text_changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._editing_index: int | None = None
        self._edit_label = QLabel("Editing your message: Enter sends it as a new branch, Esc cancels.")
        self._edit_label.setObjectName("editBanner")
        self._edit_label.hide()
        self._input = ChatInput()
        self._input.submitted.connect(self._on_input_submitted)
        self._input.textChanged.connect(self._on_input_changed)
        self._send_button = QPushButton("Send")
        self._send_button.setObjectName("sendButton")
        self._send_button.setDefault(True)
        self._send_button.setToolTip("Send (Enter)")
        self._send_button.clicked.connect(self._on_send_clicked)
        self._stop_button = QPushButton("Stop")
        self._stop_button.setObjectName("stopButton")
        self._stop_button.setToolTip("Stop the reply; the text so far is kept (Esc)")
        self._stop_button.clicked.connect(self._on_stop_clicked)
        self._attach_button = QPushButton("📎 Attach…")
        self._attach_button.setObjectName("attachButton")
        self._attach_button.setToolTip("Attach files to this chat (PDF, Word, text, Markdown, HTML, code, CSV); "
                                       "you can also drop them on the chat; or choose watched folders for it. "
                                       "Replies cite them.")
        attach_menu = QMenu(self._attach_button)
        attach_menu.setObjectName("attachMenu")
        attach_menu.addAction("Files…", self._on_attach_clicked).setObjectName("attachFilesAction")
        attach_menu.addAction("Folder collections…", self._on_collections_clicked).setObjectName(
            "attachCollectionsAction")
        self._attach_button.setMenu(attach_menu)
        #: The chat's attached files, above the message box.
        self.attachments_bar = AttachmentsBar()
        #: How much of the context the chat and the draft take, under the message box.
        self.context_meter = ContextMeter()
        self._buttons = buttons = QVBoxLayout()
        buttons.addWidget(self._send_button)
        buttons.addWidget(self._stop_button)
        buttons.addWidget(self._attach_button)
        buttons.addStretch(1)
        input_row = QHBoxLayout()
        input_row.addWidget(self._input, 1)
        input_row.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self._edit_label)
        layout.addWidget(self.attachments_bar)
        layout.addLayout(input_row)
        layout.addWidget(self.context_meter)
        self.setFocusProxy(self._input)

    # -- public API -------------------------------------------------------------------------------

    def text(self) -> str:
        return self._input.toPlainText()

    @property
    def input_box(self) -> ChatInput:
        """The message box (the chat pane takes file drops on it)."""
        return self._input

    def set_text(self, text: str) -> None:
        self._input.setPlainText(text)

    def clear(self) -> None:
        self._input.clear()

    @property
    def editing_index(self) -> int | None:
        """The message being edited (sending it makes a new branch), or None."""
        return self._editing_index

    def set_editing(self, index: int | None) -> None:
        """Say that sending replaces message ``index`` (None: stop saying so)."""
        self._editing_index = index
        self._edit_label.setVisible(index is not None)

    def update_controls(self, *, can_send: bool, is_streaming: bool, is_model_ready: bool,
                        is_editing: bool) -> None:
        """Enable the buttons and word the box's placeholder for the conversation's state."""
        self._send_button.setEnabled(can_send and bool(self._input.toPlainText().strip()))
        self._send_button.setText("Save && send" if is_editing else "Send")  # "&&": a lone "&" is a mnemonic
        self._stop_button.setEnabled(is_streaming)
        if not is_model_ready:
            placeholder = "Load a model in the Model pane to start chatting…"
        elif is_streaming:
            placeholder = "Hearth is replying… (Stop keeps the text so far)"
        else:
            placeholder = "Message Hearth… (Enter sends, Shift+Enter for a new line)"
        if placeholder != self._input.placeholderText():
            self._input.setPlaceholderText(placeholder)
            self._input.viewport().update()  # Qt does not repaint a placeholder whose text alone changed

    def add_button(self, widget: QWidget) -> None:
        """Put ``widget`` under the buttons beside the box (the chat's Tools button)."""
        self._buttons.insertWidget(self._buttons.count() - 1, widget)  # above the stretch

    def set_font_size(self, points: int) -> None:
        """Use ``points`` for the message box (0: the system's size)."""
        font = QFont(self._input.font())
        font.setPointSizeF(points if points > 0 else QFont().pointSizeF())
        self._input.setFont(font)

    # -- widget events ----------------------------------------------------------------------------

    @Slot()
    def _on_input_submitted(self) -> None:
        self.send_requested.emit()

    @Slot()
    def _on_send_clicked(self) -> None:
        self.send_requested.emit()

    @Slot()
    def _on_stop_clicked(self) -> None:
        self.stop_requested.emit()

    @Slot()
    def _on_attach_clicked(self) -> None:
        self.attach_requested.emit()

    @Slot()
    def _on_collections_clicked(self) -> None:
        self.collections_requested.emit()

    @Slot()
    def _on_input_changed(self) -> None:
        self.text_changed.emit()
