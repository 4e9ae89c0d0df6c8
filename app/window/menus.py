"""The main window's menu bar: File, Chat, View and Help, their shortcuts, and what each item does (Help's own
items: ``app/window/help_menu.py``).

Every item hands its work to a pane or to the window (export, import, settings, layout), so a new item is one line
here and a method where the work belongs; the window's own module keeps the panes and the wiring between them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from PySide6.QtCore import QObject, Qt, Slot
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMenu, QMessageBox

from app.model.discover import show_discover
from app.window.help_menu import HelpMenu
from app.window.settings_dialog import SettingsDialog

if TYPE_CHECKING:
    from app.window.main_window import MainWindow


class WindowMenus(QObject):
    """Builds the window's menus and answers their items; each action is named (``newChatAction``, …) for tests.

    Args:
        window: the main window; its chat pane, docks, settings and storage are what the items act on.
    """

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self._build()

    @property
    def _window(self) -> MainWindow:
        """The window, as this object's Qt parent: a Python reference back to it would make a cycle that keeps the
        window's wrapper alive after Qt deleted it (automatic garbage collection is off: ``app/gui_gc.py``)."""
        return cast("MainWindow", self.parent())

    def _add_action(self, menu: QMenu, text: str, name: str, slot: Callable[[], object],
                    shortcut: QKeySequence | QKeySequence.StandardKey | str | None = None) -> QAction:
        action = QAction(text, self._window)
        action.setObjectName(name)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
            action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _build(self) -> None:
        window, chat = self._window, self._window.chat_pane
        file_menu = window.menuBar().addMenu("&File")
        self._add_action(file_menu, "&New chat", "newChatAction", self._on_new_chat_triggered,
                         QKeySequence.StandardKey.New)
        file_menu.addSeparator()
        self._add_action(file_menu, "&Import conversation (JSON)…", "importJsonAction",
                         self._on_import_json_triggered)
        self._add_action(file_menu, "Export as &Markdown…", "exportMarkdownAction",
                         self._on_export_markdown_triggered)
        self._add_action(file_menu, "Export as &JSON…", "exportJsonAction", self._on_export_json_triggered)
        file_menu.addSeparator()
        self._add_action(file_menu, "&Settings…", "settingsAction", self._on_settings_triggered, "Ctrl+,")
        file_menu.addSeparator()
        self._add_action(file_menu, "&Quit", "quitAction", window.close, QKeySequence.StandardKey.Quit)

        chat_menu = window.menuBar().addMenu("&Chat")
        self._add_action(chat_menu, "&Focus message box", "focusInputAction", chat.focus_input, "Ctrl+L")
        self._add_action(chat_menu, "&Search conversations", "searchAction", self._on_search_triggered,
                         "Ctrl+F")
        chat_menu.addSeparator()
        self._add_action(chat_menu, "&Regenerate reply", "regenerateAction", self._on_regenerate_triggered,
                         "Ctrl+R")
        self._add_action(chat_menu, "&Continue reply", "continueAction", self._on_continue_triggered,
                         "Ctrl+Shift+R")
        self._add_action(chat_menu, "S&top reply", "stopAction", chat.escape, "Esc")
        self._add_action(chat_menu, "Copy &last reply", "copyReplyAction", self._on_copy_reply_triggered,
                         "Ctrl+Shift+C")
        chat_menu.addSeparator()
        self._add_action(chat_menu, "&Rename conversation", "renameAction", self._on_rename_triggered, "F2")
        self._add_action(chat_menu, "System prompt &presets…", "presetsAction", chat.open_presets_dialog)
        self._add_action(chat_menu, "Folder &collections…", "collectionsAction",
                         chat.documents.open_collections_dialog)

        view_menu = window.menuBar().addMenu("&View")
        for dock in (window.model_dock, window.models_dock, window.monitor_dock):
            view_menu.addAction(dock.toggleViewAction())
        self._add_action(view_menu, "&Discover models on Hugging Face…", "discoverAction", self._on_discover_triggered)
        view_menu.addSeparator()
        self._add_action(view_menu, "&Reset layout", "resetLayoutAction", window.reset_layout)

        help_menu = window.menuBar().addMenu("&Help")
        self.help = HelpMenu(window, help_menu)
        about = QAction("&About Hearth", window)
        about.triggered.connect(self._on_about_triggered)
        help_menu.addAction(about)

    @Slot()
    def _on_new_chat_triggered(self) -> None:
        self._window.chat_pane.new_conversation()

    @Slot()
    def _on_search_triggered(self) -> None:
        self._window.chat_pane.focus_search()

    @Slot()
    def _on_regenerate_triggered(self) -> None:
        self._window.chat_pane.regenerate()

    @Slot()
    def _on_continue_triggered(self) -> None:
        self._window.chat_pane.continue_reply()

    @Slot()
    def _on_copy_reply_triggered(self) -> None:
        chat = self._window.chat_pane
        conversation = chat.current_conversation
        if conversation is not None and conversation.messages:
            chat.copy_message(len(conversation.messages) - 1)

    @Slot()
    def _on_rename_triggered(self) -> None:
        chat = self._window.chat_pane
        if chat.current_conversation is not None:
            chat.sidebar.edit_title(chat.current_conversation.id)

    @Slot()
    def _on_discover_triggered(self) -> None:
        show_discover(self._window)

    @Slot()
    def _on_settings_triggered(self) -> None:
        window = self._window
        dialog = SettingsDialog(window.settings, window.storage.list_presets(), window)
        if dialog.exec() == SettingsDialog.DialogCode.Accepted:
            dialog.apply_to(window.settings)
            window.apply_settings()

    @Slot()
    def _on_export_markdown_triggered(self) -> None:
        self._window.export_conversation("markdown")

    @Slot()
    def _on_export_json_triggered(self) -> None:
        self._window.export_conversation("json")

    @Slot()
    def _on_import_json_triggered(self) -> None:
        self._window.import_conversation()

    @Slot()
    def _on_about_triggered(self) -> None:
        QMessageBox.about(self._window, "About Hearth",
                          "<h3>Hearth</h3><p>Chat with language models on your own computer, "
                          "on Hearth's own inference engine.</p>")
