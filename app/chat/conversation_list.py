"""The conversation sidebar: search field, list (rename in place), new/delete buttons, undo bar.

Each row is the title, then when the conversation was last active ("Today 14:02", "Yesterday 09:15", "3 Nov"),
so that several with one title can be told apart, then the search snippet when searching.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from PySide6.QtCore import QPoint, Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from app.data import records as db

#: How long the "Undo" offer stays after a delete.
UNDO_TIMEOUT_MS = 8000
#: Typing in the search field re-queries after this pause.
SEARCH_DELAY_MS = 150


def when_text(timestamp: float, now: datetime | None = None) -> str:
    """When, in local time, as a list reads it: "Today 14:02", "Yesterday 09:15", "3 Nov", "3 Nov 2025"."""
    moment = datetime.fromtimestamp(timestamp)
    today = (now or datetime.now()).date()
    if moment.date() == today:
        return f"Today {moment:%H:%M}"
    if moment.date() == today - timedelta(days=1):
        return f"Yesterday {moment:%H:%M}"
    day = f"{moment.day} {moment:%b}"
    return day if moment.year == today.year else f"{day} {moment.year}"


class ConversationList(QWidget):
    """Shows conversations; the chat pane fills it with :meth:`show_conversations`.

    Double-click (or F2, or the context menu) renames a conversation in place.

    Signals:
        conversation_selected(int): the user picked a conversation.
        new_requested(): "New chat" was clicked.
        delete_requested(int): "Delete" was clicked for a conversation.
        rename_requested(int, str): a title was edited.
        undo_delete_requested(int): "Undo" was clicked after a delete.
        search_changed(str): the search text changed (after a short pause).
    """

    conversation_selected = Signal(int)
    new_requested = Signal()
    delete_requested = Signal(int)
    rename_requested = Signal(int, str)
    undo_delete_requested = Signal(int)
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("conversationSidebar")
        self._deleted_id: int | None = None
        self._search_edit = QLineEdit()
        self._search_edit.setObjectName("conversationSearch")
        self._search_edit.setPlaceholderText("Search conversations (Ctrl+F)")
        self._search_edit.setClearButtonEnabled(True)
        self._search_timer = QTimer(self)
        self._search_timer.setObjectName("search-timer")
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(self._on_search_timeout)
        self._search_edit.textChanged.connect(self._on_search_text_changed)

        self._list = QListWidget()
        self._list.setObjectName("conversationList")
        self._list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self._list.setWordWrap(True)  # a long title takes a second line rather than being cut off
        self._list.setEditTriggers(QAbstractItemView.EditTrigger.DoubleClicked
                                   | QAbstractItemView.EditTrigger.EditKeyPressed)
        self._list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self._list.customContextMenuRequested.connect(self._on_context_menu_requested)
        self._list.currentItemChanged.connect(self._on_current_item_changed)
        self._list.itemChanged.connect(self._on_item_changed)

        self._new_button = QPushButton("New chat")
        self._new_button.setObjectName("newChatButton")
        self._new_button.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_FileIcon))
        self._new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self._new_button.clicked.connect(self.new_requested)
        self._delete_button = QPushButton("Delete")
        self._delete_button.setObjectName("deleteChatButton")
        self._delete_button.setToolTip("Delete the selected conversation")
        self._delete_button.clicked.connect(self._on_delete_clicked)

        self._undo_label = QLabel()
        self._undo_label.setObjectName("undoDeleteLabel")
        self._undo_label.setWordWrap(True)
        self._undo_button = QPushButton("Undo")
        self._undo_button.setObjectName("undoDeleteButton")
        self._undo_button.clicked.connect(self._on_undo_clicked)
        self._undo_bar = QFrame()
        self._undo_bar.setObjectName("undoBar")
        self._undo_bar.setFrameShape(QFrame.Shape.StyledPanel)
        undo_layout = QHBoxLayout(self._undo_bar)
        undo_layout.setContentsMargins(6, 2, 2, 2)
        undo_layout.addWidget(self._undo_label, 1)
        undo_layout.addWidget(self._undo_button)
        self._undo_bar.hide()
        self._undo_timer = QTimer(self)
        self._undo_timer.setObjectName("undo-timer")
        self._undo_timer.setSingleShot(True)
        self._undo_timer.setInterval(UNDO_TIMEOUT_MS)
        self._undo_timer.timeout.connect(self.hide_undo)

        title = QLabel("Conversations")
        title.setObjectName("paneTitle")
        buttons = QHBoxLayout()
        buttons.addWidget(self._new_button)
        buttons.addWidget(self._delete_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 6, 0)
        layout.addWidget(title)
        layout.addWidget(self._search_edit)
        layout.addWidget(self._list, 1)
        layout.addWidget(self._undo_bar)
        layout.addLayout(buttons)

    # -- public API -------------------------------------------------------------------------------

    @property
    def search_text(self) -> str:
        return self._search_edit.text().strip()

    def set_search_text(self, text: str) -> None:
        self._search_edit.setText(text)

    def focus_search(self) -> None:
        self._search_edit.setFocus()
        self._search_edit.selectAll()

    def show_conversations(self, entries: list[tuple[db.Conversation, str]], current_id: int | None,
                           streaming_ids: set[int]) -> None:
        """Fill the list with (conversation, snippet) pairs; mark ``current_id`` selected."""
        self._list.blockSignals(True)
        self._list.clear()
        now = datetime.now()
        for conversation, snippet in entries:
            label = conversation.title + (" …" if conversation.id in streaming_ids else "")
            label += "\n" + when_text(conversation.updated_at, now)
            item = QListWidgetItem(label if not snippet or snippet == conversation.title
                                   else f"{label}\n{snippet}")
            item.setData(Qt.ItemDataRole.UserRole, conversation.id)
            last_active = datetime.fromtimestamp(conversation.updated_at)
            item.setToolTip(f"{snippet or conversation.title}\nLast active {last_active:%d %b %Y, %H:%M}")
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self._list.addItem(item)
            if conversation.id == current_id:
                self._list.setCurrentItem(item)
        self._list.blockSignals(False)
        self._delete_button.setEnabled(current_id is not None)

    def item_for(self, conversation_id: int) -> QListWidgetItem | None:
        for row in range(self._list.count()):
            item = self._list.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == conversation_id:
                return item
        return None

    def edit_title(self, conversation_id: int) -> None:
        """Start renaming a conversation in place."""
        item = self.item_for(conversation_id)
        if item is not None:
            self._list.blockSignals(True)
            item.setText(self._title_of(item))
            self._list.blockSignals(False)
            self._list.editItem(item)

    def offer_undo(self, conversation_id: int, title: str) -> None:
        """Show "Deleted … Undo" for :data:`UNDO_TIMEOUT_MS`."""
        self._deleted_id = conversation_id
        self._undo_label.setText(f"Deleted “{title}”.")
        self._undo_bar.show()
        self._undo_timer.start()

    @Slot()
    def hide_undo(self) -> None:
        self._deleted_id = None
        self._undo_bar.hide()
        self._undo_timer.stop()

    # -- events -----------------------------------------------------------------------------------

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_current_item_changed(self, current: QListWidgetItem | None,
                                 previous: QListWidgetItem | None) -> None:
        if current is not None:
            self.conversation_selected.emit(int(current.data(Qt.ItemDataRole.UserRole)))

    @Slot(QListWidgetItem)
    def _on_item_changed(self, item: QListWidgetItem) -> None:
        title = " ".join(item.text().split("\n", 1)[0].split()).removesuffix(" …")
        if title:
            self.rename_requested.emit(int(item.data(Qt.ItemDataRole.UserRole)), title)

    @Slot()
    def _on_delete_clicked(self) -> None:
        item = self._list.currentItem()
        if item is not None:
            self.delete_requested.emit(int(item.data(Qt.ItemDataRole.UserRole)))

    @Slot()
    def _on_undo_clicked(self) -> None:
        if self._deleted_id is not None:
            conversation_id = self._deleted_id
            self.hide_undo()
            self.undo_delete_requested.emit(conversation_id)

    @Slot(str)
    def _on_search_text_changed(self, text: str) -> None:
        self._search_timer.start()

    @Slot()
    def _on_search_timeout(self) -> None:
        self.search_changed.emit(self.search_text)

    @Slot(QPoint)
    def _on_context_menu_requested(self, pos: QPoint) -> None:
        item = self._list.itemAt(pos)
        if item is None:
            return
        conversation_id = int(item.data(Qt.ItemDataRole.UserRole))
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.edit_title(conversation_id))
        menu.addAction("Delete", lambda: self.delete_requested.emit(conversation_id))
        menu.exec(self._list.viewport().mapToGlobal(pos))

    @staticmethod
    def _title_of(item: QListWidgetItem) -> str:
        return item.text().split("\n", 1)[0].removesuffix(" …")
