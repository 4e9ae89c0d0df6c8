"""The Help menu's items: the documentation, the keyboard shortcuts, the data folder, and diagnostics to copy.

The shortcuts dialog reads the window's actions, so it lists the shortcuts that work, not a copy that could drift.
The diagnostics are what a bug report needs (Hearth's and torch's versions, the OS, the CPU's vector flags, the
model that runs and its precision), as plain text on the clipboard. Nothing opens a browser or a file manager
until its item is clicked.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from PySide6.QtCore import QObject, QUrl, Slot
from PySide6.QtGui import QAction, QDesktopServices, QGuiApplication, QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QMenu,
    QMessageBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

if TYPE_CHECKING:
    from app.window.main_window import MainWindow

#: The source tree's root when Hearth runs from a checkout (README.md and docs/ sit there).
SOURCE_ROOT = Path(__file__).resolve().parents[2]
#: The CPU features the engine's kernels choose between (``engine.api.HardwareInfo`` fields).
CPU_FLAGS = ("avx2", "avx512", "avx512_bf16", "amx")


def documentation_path(root: Path = SOURCE_ROOT) -> Path | None:
    """The README shipped with this copy (else its docs folder), or None where neither was installed."""
    for candidate in (root / "README.md", root / "docs"):
        if candidate.exists():
            return candidate
    return None


def shown_action_text(text: str) -> str:
    """An action's text as its menu shows it: without mnemonic marks ("&&" is a literal "&") or a trailing "…"."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").removesuffix("…")


def shortcut_rows(window: QWidget) -> list[tuple[str, str]]:
    """(what, keys) for every action of ``window`` that has a shortcut, in the order the actions were made."""
    rows: list[tuple[str, str]] = []
    for action in window.findChildren(QAction):
        keys = [key.toString(QKeySequence.SequenceFormat.NativeText) for key in action.shortcuts() if not key.isEmpty()]
        row = (shown_action_text(action.text()), ", ".join(keys))
        if keys and row not in rows:
            rows.append(row)
    return rows


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def diagnostics_text(window: MainWindow, hardware: Any = None) -> str:
    """Plain text for a bug report: versions, OS, CPU and its flags, and the model that runs at which precision."""
    lines = [f"Hearth {_version('hearth')}",
             f"OS: {platform.platform()}",
             f"Python {platform.python_version()} ({sys.executable})",
             f"torch {_version('torch')}, PySide6 {_version('PySide6')}"]
    if hardware is not None:
        flags = [flag for flag in CPU_FLAGS if getattr(hardware, flag, False)]
        lines.append(f"CPU: {getattr(hardware, 'cpu_model', '?')}, {getattr(hardware, 'physical_cores', '?')} cores; "
                     f"flags: {', '.join(flags) or 'none of ' + ', '.join(CPU_FLAGS)}")
        ram = getattr(hardware, "ram_total_bytes", 0) or 0
        lines.append(f"RAM: {ram / 2**30:.1f} GiB; GPUs: {len(getattr(hardware, 'gpus', []) or [])}")
    else:
        lines.append(f"CPU: {platform.processor() or platform.machine()} (flags not detected yet)")
    info = window.bridge.model_info
    if info is None:
        lines.append("Model: none loaded")
    else:
        lines.append(f"Model: {info.model_name} ({info.spec}) on {info.device}, precision {info.precision}, "
                     f"computes in {info.dtype}")
    lines.append(f"Data folder: {window.data_dir}")
    return "\n".join(lines)


class ShortcutsDialog(QDialog):
    """A table of the window's shortcuts, read from its actions."""

    def __init__(self, window: QWidget) -> None:
        super().__init__(window)
        self.setObjectName("shortcutsDialog")
        self.setWindowTitle("Keyboard shortcuts")
        rows = shortcut_rows(window)
        table = self.table = QTableWidget(len(rows), 2)
        table.setObjectName("shortcutsTable")
        table.setHorizontalHeaderLabels(["What it does", "Keys"])
        table.verticalHeader().hide()
        table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        for row, (what, keys) in enumerate(rows):
            table.setItem(row, 0, QTableWidgetItem(what))
            table.setItem(row, 1, QTableWidgetItem(keys))
        table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(table)
        layout.addWidget(buttons)
        self.resize(460, 420)


class HelpMenu(QObject):
    """Adds the Help items to ``menu`` and answers them; each action is named for tests.

    Args:
        window: the main window (its actions, data folder, bridge); also this object's Qt parent.
        menu: the Help menu.
    """

    def __init__(self, window: MainWindow, menu: QMenu) -> None:
        super().__init__(window)
        self._hardware: Any = None
        window.bridge.signals.hardware_detected.connect(self._on_hardware_detected)
        for text, name, slot in (("&Documentation", "documentationAction", self._on_documentation_triggered),
                                 ("&Keyboard shortcuts", "shortcutsAction", self._on_shortcuts_triggered),
                                 ("Open data &folder", "openDataFolderAction", self._on_open_data_folder_triggered),
                                 ("&Copy diagnostics", "copyDiagnosticsAction", self._on_copy_diagnostics_triggered)):
            action = QAction(text, window)
            action.setObjectName(name)
            action.triggered.connect(slot)
            menu.addAction(action)
        menu.addSeparator()

    @property
    def _window(self) -> MainWindow:
        return cast("MainWindow", self.parent())

    @Slot(object)
    def _on_hardware_detected(self, info: Any) -> None:
        self._hardware = info

    @Slot()
    def _on_documentation_triggered(self) -> None:
        path = documentation_path()
        if path is None:
            QMessageBox.information(self._window, "Documentation",
                                    "The documentation was not installed with this copy of Hearth; it is the "
                                    "README.md and docs/ folder of Hearth's source.")
            return
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))

    @Slot()
    def _on_shortcuts_triggered(self) -> None:
        ShortcutsDialog(self._window).exec()

    @Slot()
    def _on_open_data_folder_triggered(self) -> None:
        folder = Path(self._window.data_dir)
        folder.mkdir(parents=True, exist_ok=True)
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    @Slot()
    def _on_copy_diagnostics_triggered(self) -> None:
        QGuiApplication.clipboard().setText(diagnostics_text(self._window, self._hardware))
        self._window.statusBar().showMessage("Diagnostics copied to the clipboard.", 4000)
