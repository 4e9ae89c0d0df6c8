"""The settings dialog's "Tools (MCP)" page: the servers of ``mcp.json`` with their states and tools; add, edit,
enable or disable, remove, and start one to see its tools. Each change is saved to ``mcp.json`` at once (through
:class:`~app.tools.mcp_servers.McpServers`), whether the dialog ends with OK or Cancel: it is a list of servers,
not a choice to confirm. Names, errors and descriptions come from servers: they are shown as plain text.

Under the list, the chats' tool loop: its step limit (replies with tool calls per answer) and each call's timeout,
saved to ``settings.ini`` at once as well; each reply reads them as it starts."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.data.settings import (
    MAX_TOOL_STEPS,
    MAX_TOOL_TIMEOUT_S,
    MIN_TOOL_STEPS,
    MIN_TOOL_TIMEOUT_S,
    Settings,
)
from app.tools.mcp_servers import McpServers
from app.tools.server_dialog import ServerDialog

_NAME_ROLE = Qt.ItemDataRole.UserRole


class McpPage(QWidget):
    """The page; it owns its :class:`McpServers` and stops the servers it started in :meth:`close_servers`."""

    def __init__(self, data_dir: Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("mcpPage")
        self.servers = McpServers(data_dir, self)
        intro = QLabel(f"MCP servers give models tools. They are kept in {self.servers.path}, in the format of "
                       "Claude Desktop, Cursor and LM Studio: a file from them can be pasted there unchanged. "
                       "No tool runs without your approval.")
        intro.setTextFormat(Qt.TextFormat.PlainText)
        intro.setWordWrap(True)
        self._file_error = QLabel()
        self._file_error.setObjectName("mcpFileError")
        self._file_error.setTextFormat(Qt.TextFormat.PlainText)
        self._file_error.setWordWrap(True)
        self.tree = QTreeWidget()
        self.tree.setObjectName("mcpServerTree")
        self.tree.setHeaderLabels(["Server", "State"])
        self.tree.setColumnWidth(0, 220)
        self.detail = QPlainTextEdit()
        self.detail.setObjectName("mcpServerDetail")
        self.detail.setReadOnly(True)
        self.detail.setMaximumHeight(110)
        self._buttons: dict[str, QPushButton] = {}
        row = QHBoxLayout()
        for key, text, slot in (("add", "Add…", self._on_add), ("edit", "Edit…", self._on_edit),
                                ("remove", "Remove", self._on_remove), ("start", "Start", self._on_start)):
            button = QPushButton(text)
            button.setObjectName(f"mcp{key.title()}Button")
            button.clicked.connect(slot)
            row.addWidget(button)
            self._buttons[key] = button
        row.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self._file_error)
        layout.addWidget(self.tree, 1)
        layout.addWidget(self.detail)
        layout.addLayout(row)
        layout.addLayout(self._loop_form(Settings(Path(data_dir))))
        self.servers.config_changed.connect(self._on_config_changed)
        self.servers.state_changed.connect(self._on_state_changed)
        self.tree.currentItemChanged.connect(self._on_selection)
        self.tree.itemChanged.connect(self._on_item_changed)
        self._on_config_changed()

    def _loop_form(self, settings: Settings) -> QFormLayout:
        """The step limit and the call timeout, each saved as it changes."""
        self.settings = settings
        self.steps_spin = QSpinBox()
        self.steps_spin.setObjectName("toolStepsSpin")
        self.steps_spin.setRange(MIN_TOOL_STEPS, MAX_TOOL_STEPS)
        self.steps_spin.setValue(settings.tool_max_steps)
        self.steps_spin.setToolTip("How many replies with tool calls one answer may take; then the loop stops")
        self.timeout_spin = QSpinBox()
        self.timeout_spin.setObjectName("toolTimeoutSpin")
        self.timeout_spin.setRange(MIN_TOOL_TIMEOUT_S, MAX_TOOL_TIMEOUT_S)
        self.timeout_spin.setSuffix(" s")
        self.timeout_spin.setValue(settings.tool_call_timeout_s)
        self.timeout_spin.setToolTip("A tool that has not answered by then is abandoned, and the model is told so")
        self.steps_spin.valueChanged.connect(self._on_limits_changed)
        self.timeout_spin.valueChanged.connect(self._on_limits_changed)
        form = QFormLayout()
        form.addRow("Tool steps per answer", self.steps_spin)
        form.addRow("Tool call timeout", self.timeout_spin)
        return form

    @Slot()
    def _on_limits_changed(self) -> None:
        self.settings.tool_max_steps = self.steps_spin.value()
        self.settings.tool_call_timeout_s = self.timeout_spin.value()
        self.settings.sync()

    # --- reading the list ------------------------------------------------------------------------------------------
    def item(self, name: str) -> QTreeWidgetItem | None:
        """``name``'s row."""
        for i in range(self.tree.topLevelItemCount()):
            item = self.tree.topLevelItem(i)
            if item is not None and item.data(0, _NAME_ROLE) == name:
                return item
        return None

    def state_text(self, name: str) -> str:
        item = self.item(name)
        return item.text(1) if item is not None else ""

    def tool_names(self, name: str) -> list[str]:
        item = self.item(name)
        children = [item.child(i) for i in range(item.childCount())] if item is not None else []
        return [child.text(0) for child in children if child is not None]

    def selected_name(self) -> str | None:
        item = self.tree.currentItem()
        while item is not None and item.parent() is not None:
            item = item.parent()
        return None if item is None else str(item.data(0, _NAME_ROLE))

    def select(self, name: str) -> None:
        item = self.item(name)
        if item is not None:
            self.tree.setCurrentItem(item)

    # --- filling it ------------------------------------------------------------------------------------------------
    @Slot()
    def _on_config_changed(self) -> None:
        selected = self.selected_name()
        self.tree.blockSignals(True)
        self.tree.clear()
        config = self.servers.config
        for name in [*config.servers, *config.problems]:
            item = QTreeWidgetItem([name, ""])
            item.setData(0, _NAME_ROLE, name)
            server = config.servers.get(name)
            if server is not None:
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
                item.setCheckState(0, Qt.CheckState.Checked if server.enabled else Qt.CheckState.Unchecked)
                item.setToolTip(0, "Checked: enabled")
            self.tree.addTopLevelItem(item)
            self._fill(item)
        self.tree.blockSignals(False)
        error = self.servers.load_error
        self._file_error.setText(f"{error} (Fix or remove the file; servers added here replace it.)" if error else "")
        self._file_error.setVisible(bool(error))
        if selected is not None:
            self.select(selected)
        self._on_selection()

    def _fill(self, item: QTreeWidgetItem) -> None:
        view = self.servers.view(str(item.data(0, _NAME_ROLE)))
        item.setText(1, view.text)
        item.setToolTip(1, view.detail or view.text)
        for child in item.takeChildren():
            del child
        for tool, description in view.tools:
            child = QTreeWidgetItem([tool, description.strip().splitlines()[0] if description.strip() else ""])
            child.setToolTip(1, description)
            item.addChild(child)
        item.setExpanded(bool(view.tools))

    @Slot(str)
    def _on_state_changed(self, name: str) -> None:
        item = self.item(name)
        if item is not None:
            self.tree.blockSignals(True)
            self._fill(item)
            self.tree.blockSignals(False)
        if name == self.selected_name():
            self._on_selection()

    @Slot()
    def _on_selection(self) -> None:
        name = self.selected_name()
        server = self.servers.config.servers.get(name) if name is not None else None
        for key in ("edit", "start"):
            self._buttons[key].setEnabled(server is not None and (key == "edit" or server.enabled))
        self._buttons["remove"].setEnabled(name is not None)
        if name is None:
            self.detail.setPlainText("")
            return
        view = self.servers.view(name)
        self._buttons["start"].setText("Restart" if view.state == "ready" else "Start")
        where = server.url if server is not None and server.transport == "http" else (
            " ".join([server.command, *server.args]) if server is not None else "")
        self.detail.setPlainText("\n".join(part for part in (where, view.text, view.detail) if part))

    # --- changing it -----------------------------------------------------------------------------------------------
    def open_editor(self, name: str | None = None) -> ServerDialog:
        """The add (``name`` None) or edit dialog, shown without blocking; accepting it saves and starts the
        server, so that its state and tools show."""
        server = self.servers.config.servers.get(name) if name is not None else None
        taken = [n for n in [*self.servers.config.servers, *self.servers.config.problems] if n != name]
        dialog = ServerDialog(server, taken, self)
        dialog.accepted.connect(lambda: self._on_editor_accepted(dialog, name))
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def _on_editor_accepted(self, dialog: ServerDialog, old_name: str | None) -> None:
        if dialog.server is None:
            return
        try:
            self.servers.put(dialog.server, old_name)
        except OSError as exc:
            QMessageBox.warning(self, "Hearth", f"{self.servers.path} could not be written: {exc}")
            return
        self.select(dialog.server.name)
        self.servers.start(dialog.server.name)

    def set_enabled(self, name: str, enabled: bool) -> None:
        item = self.item(name)
        if item is not None:
            item.setCheckState(0, Qt.CheckState.Checked if enabled else Qt.CheckState.Unchecked)

    @Slot(QTreeWidgetItem, int)
    def _on_item_changed(self, item: QTreeWidgetItem, column: int) -> None:
        if column == 0 and item.parent() is None:
            self.servers.set_enabled(str(item.data(0, _NAME_ROLE)), item.checkState(0) == Qt.CheckState.Checked)

    @Slot()
    def _on_add(self) -> None:
        self.open_editor(None)

    @Slot()
    def _on_edit(self) -> None:
        if (name := self.selected_name()) is not None:
            self.open_editor(name)

    @Slot()
    def _on_remove(self) -> None:
        if (name := self.selected_name()) is not None:
            self.servers.remove(name)

    @Slot()
    def _on_start(self) -> None:
        if (name := self.selected_name()) is not None:
            self.servers.start(name)

    @Slot()
    def close_servers(self) -> None:
        """Stop the servers this page started (the chats start their own when they need them)."""
        self.servers.close()
