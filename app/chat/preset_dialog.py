"""The presets dialog: add, edit and delete the system-prompt presets stored in the database."""

from __future__ import annotations

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.data.storage import Storage


class PresetDialog(QDialog):
    """Lists the presets; the selected one can be renamed, rewritten or deleted, and new ones added.

    Changes are written to the database when the user clicks Save (or Add / Delete).
    """

    def __init__(self, storage: Storage, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("presetDialog")
        self.setWindowTitle("System prompt presets")
        self.resize(640, 380)
        self._storage = storage
        self._list = QListWidget()
        self._list.setObjectName("presetList")
        self._list.currentItemChanged.connect(self._on_current_item_changed)
        self._name_edit = QLineEdit()
        self._name_edit.setObjectName("presetNameEdit")
        self._prompt_edit = QPlainTextEdit()
        self._prompt_edit.setObjectName("presetPromptEdit")
        self._error_label = QLabel()
        self._error_label.setObjectName("presetErrorLabel")
        self._error_label.setStyleSheet("color: #c62828")
        self._error_label.setWordWrap(True)
        self._add_button = QPushButton("Add")
        self._add_button.setObjectName("addPresetButton")
        self._add_button.setToolTip("Save the name and prompt as a new preset")
        self._add_button.clicked.connect(self._on_add_clicked)
        self._save_button = QPushButton("Save")
        self._save_button.setObjectName("savePresetButton")
        self._save_button.setToolTip("Save changes to the selected preset")
        self._save_button.clicked.connect(self._on_save_clicked)
        self._delete_button = QPushButton("Delete")
        self._delete_button.setObjectName("deletePresetButton")
        self._delete_button.clicked.connect(self._on_delete_clicked)

        form = QFormLayout()
        form.addRow("Name", self._name_edit)
        form.addRow("System prompt", self._prompt_edit)
        buttons = QHBoxLayout()
        for button in (self._add_button, self._save_button, self._delete_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        editor = QVBoxLayout()
        editor.addLayout(form, 1)
        editor.addWidget(self._error_label)
        editor.addLayout(buttons)
        body = QHBoxLayout()
        body.addWidget(self._list, 1)
        body.addLayout(editor, 2)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(body, 1)
        layout.addWidget(close)
        self._reload()

    def select(self, preset_id: int | None) -> None:
        """Select a preset in the list (None: the first)."""
        for row in range(self._list.count()):
            item = self._list.item(row)
            if preset_id is None or item.data(Qt.ItemDataRole.UserRole) == preset_id:
                self._list.setCurrentItem(item)
                return

    def _reload(self, select: int | None = None) -> None:
        self._list.blockSignals(True)
        self._list.clear()
        for preset in self._storage.list_presets():
            item = QListWidgetItem(preset.name)
            item.setData(Qt.ItemDataRole.UserRole, preset.id)
            item.setToolTip(preset.system_prompt)
            self._list.addItem(item)
        self._list.blockSignals(False)
        self.select(select)
        self._on_current_item_changed(self._list.currentItem(), None)

    def _selected_id(self) -> int | None:
        item = self._list.currentItem()
        return None if item is None else int(item.data(Qt.ItemDataRole.UserRole))

    @Slot(QListWidgetItem, QListWidgetItem)
    def _on_current_item_changed(self, current: QListWidgetItem | None,
                                 previous: QListWidgetItem | None) -> None:
        self._error_label.clear()
        if current is None:
            self._name_edit.clear()
            self._prompt_edit.clear()
        else:
            preset = self._storage.get_preset(int(current.data(Qt.ItemDataRole.UserRole)))
            self._name_edit.setText(preset.name)
            self._prompt_edit.setPlainText(preset.system_prompt)
        self._save_button.setEnabled(current is not None)
        self._delete_button.setEnabled(current is not None)

    @Slot()
    def _on_add_clicked(self) -> None:
        try:
            preset = self._storage.add_preset(self._name_edit.text(), self._prompt_edit.toPlainText())
        except ValueError as exc:
            self._error_label.setText(str(exc))
            return
        self._reload(select=preset.id)

    @Slot()
    def _on_save_clicked(self) -> None:
        preset_id = self._selected_id()
        if preset_id is None:
            return
        try:
            self._storage.update_preset(preset_id, name=self._name_edit.text(),
                                        system_prompt=self._prompt_edit.toPlainText())
        except ValueError as exc:
            self._error_label.setText(str(exc))
            return
        self._reload(select=preset_id)

    @Slot()
    def _on_delete_clicked(self) -> None:
        preset_id = self._selected_id()
        if preset_id is not None:
            self._storage.delete_preset(preset_id)
            self._reload()
