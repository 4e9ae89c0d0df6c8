"""The settings dialog: theme, font size, default model and default preset; the MCP servers on a page of their own
(:mod:`app.tools.mcp_page`)."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLineEdit,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.data.records import Preset
from app.data.settings import MAX_FONT_SIZE, MIN_FONT_SIZE, THEMES, Settings
from app.tools.mcp_page import McpPage

_THEME_LABELS = {"system": "Follow the system", "light": "Light", "dark": "Dark"}


class SettingsDialog(QDialog):
    """Edits a :class:`Settings`; :meth:`apply_to` writes the choices back when accepted."""

    def __init__(self, settings: Settings, presets: list[Preset], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("settingsDialog")
        self.setWindowTitle("Settings")
        self._theme_combo = QComboBox()
        self._theme_combo.setObjectName("themeCombo")
        for theme in THEMES:
            self._theme_combo.addItem(_THEME_LABELS[theme], theme)
        self._theme_combo.setCurrentIndex(self._theme_combo.findData(settings.theme))
        self._font_spin = QSpinBox()
        self._font_spin.setObjectName("fontSizeSpin")
        self._font_spin.setRange(MIN_FONT_SIZE, MAX_FONT_SIZE)
        self._font_spin.setSpecialValueText("System size")
        self._font_spin.setSuffix(" pt")
        self._font_spin.setValue(settings.font_size)
        self._model_edit = QLineEdit(settings.default_model)
        self._model_edit.setObjectName("defaultModelEdit")
        self._model_edit.setPlaceholderText("Hearth's default model")
        self._model_edit.setToolTip("Put in the Model pane when Hearth starts")
        self._preset_combo = QComboBox()
        self._preset_combo.setObjectName("defaultPresetCombo")
        self._preset_combo.addItem("No system prompt", 0)
        for preset in presets:
            self._preset_combo.addItem(preset.name, preset.id)
        self._preset_combo.setCurrentIndex(max(self._preset_combo.findData(settings.default_preset_id or 0), 0))
        form = QFormLayout()
        form.addRow("Theme", self._theme_combo)
        form.addRow("Chat font size", self._font_spin)
        form.addRow("Default model", self._model_edit)
        form.addRow("New chats start with", self._preset_combo)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        general = QWidget()
        general.setLayout(form)
        self.mcp_page = McpPage(settings.path.parent)  # mcp.json sits beside settings.ini
        self.finished.connect(self.mcp_page.close_servers)
        tabs = QTabWidget()
        tabs.setObjectName("settingsTabs")
        tabs.addTab(general, "General")
        tabs.addTab(self.mcp_page, "Tools (MCP)")
        layout = QVBoxLayout(self)
        layout.addWidget(tabs)
        layout.addWidget(buttons)

    def apply_to(self, settings: Settings) -> None:
        """Store the dialog's choices in ``settings``."""
        settings.theme = str(self._theme_combo.currentData())
        settings.font_size = self._font_spin.value()
        settings.default_model = self._model_edit.text()
        settings.default_preset_id = int(self._preset_combo.currentData()) or None
        settings.sync()
