"""Widgets that fit a laptop screen: combo boxes sized by a short text, and group boxes that fold to their title.

A combo box asks for the width of its longest item, and a form of them asks for the widest row, so one long
choice ("Drop the oldest turns, keep the system prompt") set the side pane's minimum width and, through it, the
window's. Narrowed, the box elides its current text; its list still opens as wide as its items.

The model pane holds more settings than a 768-pixel-high screen shows at once; the boxes read less often fold to a
header line (:class:`FoldingSection`), so the pane needs no scrolling until one is opened. On a wide screen the
transcript's lines stop at a readable length (:class:`ReadableWidth`).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, Signal, Slot
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractScrollArea,
    QComboBox,
    QGroupBox,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

#: Characters a narrowed combo box asks room for.
NARROW_COMBO_CHARS = 14
#: Average characters in the transcript's longest lines (the bubbles' padding and indent come on top).
READABLE_CHARS = 96
#: The transcript's room around a line: document margins, a bubble's padding, border and indent.
TEXT_CHROME_PX = 100


def narrow_combo(combo: QComboBox, chars: int = NARROW_COMBO_CHARS) -> QComboBox:
    """Let ``combo`` shrink to about ``chars`` characters and grow with its layout; returns it."""
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(chars)
    combo.setSizePolicy(QSizePolicy.Policy.Expanding, combo.sizePolicy().verticalPolicy())
    return combo


class FoldingSection(QWidget):
    """A group box under a header button (▸/▾ and the box's title) that shows or hides it.

    The box keeps its frame and loses its title, which the header now shows; its widgets stay where they were,
    so code that holds them is unaffected by the fold.

    Signals:
        folded_changed(bool): the section was folded (True) or opened (False).
    """

    folded_changed = Signal(bool)

    def __init__(self, box: QGroupBox, name: str, *, is_folded: bool = False,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(name)
        self._box = box
        self._header = QToolButton()
        self._header.setObjectName(f"{name}Header")
        self._header.setText(box.title())
        self._header.setCheckable(True)
        self._header.setAutoRaise(True)
        self._header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self._header.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self._header.setStyleSheet("QToolButton { font-weight: bold; text-align: left; }")
        box.setTitle("")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self._header)
        layout.addWidget(box)
        self._header.toggled.connect(self._on_header_toggled)
        self._header.setChecked(not is_folded)
        self._on_header_toggled(not is_folded)

    @property
    def box(self) -> QGroupBox:
        return self._box

    @property
    def is_folded(self) -> bool:
        return not self._header.isChecked()

    def set_folded(self, is_folded: bool) -> None:
        """Fold the section to its header, or open it."""
        self._header.setChecked(not is_folded)

    def set_title(self, title: str) -> None:
        """The header's text (the box's title, with a word of its state if wanted)."""
        self._header.setText(title)

    @Slot(bool)
    def _on_header_toggled(self, is_open: bool) -> None:
        self._header.setArrowType(Qt.ArrowType.DownArrow if is_open else Qt.ArrowType.RightArrow)
        self._box.setVisible(is_open)
        self.folded_changed.emit(not is_open)


class ReadableWidth(QObject):
    """Keeps a text view's lines at most about :data:`READABLE_CHARS` characters long, centred in a wide view.

    A transcript stretched across a 1920-pixel screen ran its lines about 1000 pixels long, which the eye loses
    its place in. The view's margins grow instead (filled in its base colour); its scroll bar stays at the edge.
    """

    def __init__(self, view: QAbstractScrollArea, chars: int = 0) -> None:
        super().__init__(view)
        self._view = view
        self._chars = chars or READABLE_CHARS
        view.setBackgroundRole(QPalette.ColorRole.Base)
        view.setAutoFillBackground(True)
        view.installEventFilter(self)
        self.update_margins()

    def max_width(self) -> int:
        """The widest the view's text area gets, in pixels, for its current font."""
        return self._chars * self._view.fontMetrics().averageCharWidth() + TEXT_CHROME_PX

    def update_margins(self) -> None:
        """Centre a text area of at most :meth:`max_width` in the view."""
        view = self._view
        room = view.contentsRect().width() - view.verticalScrollBar().sizeHint().width()
        side = max(0, (room - self.max_width()) // 2)
        view.setViewportMargins(side, 0, side, 0)  # protected in C++, callable from Python

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self._view and event.type() in (QEvent.Type.Resize, QEvent.Type.FontChange):
            self.update_margins()
        return False
