"""The chat's Tools button, by the message box: whether this chat's replies may call MCP tools, which servers and
which of their tools, and what their definitions cost in prompt tokens. No MCP here: :class:`~app.tools.chat_tools.ChatTools` fills it
and acts on its signals."""

from __future__ import annotations

from PySide6.QtCore import Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QToolButton, QWidget


class ToolsButton(QToolButton):
    """A button whose menu turns tools on or off for the chat shown, and each server and each of its tools on or
    off for it (a chat that needs two tools of twenty keeps a small model's prompt short).

    Signals:
        enabled_toggled(bool): "Use tools in this chat" was switched.
        server_toggled(str, bool): a server was switched on or off for this chat.
        tool_toggled(str, str, bool): a server's tool was switched on or off for this chat.
        menu_opening(): the menu is about to show (the servers may have changed in Settings).
    """

    enabled_toggled = Signal(bool)
    server_toggled = Signal(str, bool)
    tool_toggled = Signal(str, str, bool)
    menu_opening = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("toolsButton")
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self._menu = QMenu(self)
        self._menu.setObjectName("toolsMenu")
        self._menu.aboutToShow.connect(self._on_about_to_show)
        self.setMenu(self._menu)
        self.show_state(False, [], "Tools: off", "")

    def show_state(self, enabled: bool, servers: list[tuple[str, bool]], text: str, summary: str,
                   tools: dict[str, list[tuple[str, bool]]] | None = None) -> None:
        """Show the chat's choice: ``servers`` as (name, on) pairs, ``text`` on the button, ``summary`` in words;
        ``tools`` gives each started server's tools as (name, on) pairs, listed under it."""
        self.setText(f"🛠 {text}")
        self.setToolTip(summary or "Let the model call the tools of your MCP servers in this chat (each call asks "
                        "you first)")
        self._menu.clear()
        use = QAction("Use tools in this chat", self._menu)
        use.setObjectName("useToolsAction")
        use.setCheckable(True)
        use.setChecked(enabled)
        use.toggled.connect(self.enabled_toggled)
        self._menu.addAction(use)
        self._menu.addSeparator()
        if not servers:
            none = self._menu.addAction("No MCP servers yet: add them in Settings → Tools (MCP)")
            none.setEnabled(False)
        for name, on in servers:
            action = QAction(name, self._menu)
            action.setObjectName(f"toolsServer:{name}")
            action.setCheckable(True)
            action.setChecked(on)
            action.setEnabled(enabled)
            action.toggled.connect(lambda checked, n=name: self.server_toggled.emit(n, checked))
            self._menu.addAction(action)
            for tool, tool_on in (tools or {}).get(name, []):
                item = QAction(f"    {tool}", self._menu)
                item.setObjectName(f"toolsTool:{name}/{tool}")
                item.setCheckable(True)
                item.setChecked(tool_on)
                item.setEnabled(enabled and on)
                item.setToolTip(f"Offer {tool} of {name} to the model in this chat")
                item.toggled.connect(lambda checked, n=name, t=tool: self.tool_toggled.emit(n, t, checked))
                self._menu.addAction(item)
        if summary:
            self._menu.addSeparator()
            self._menu.addAction(summary).setEnabled(False)

    def action(self, name: str, tool: str | None = None) -> QAction | None:
        """The menu's "Use tools" action (``"use"``), a server's by name, or one of its tools' (for the window's
        tests and menus)."""
        wanted = ("useToolsAction" if name == "use" else f"toolsServer:{name}" if tool is None
                  else f"toolsTool:{name}/{tool}")
        return next((a for a in self._menu.actions() if a.objectName() == wanted), None)

    @Slot()
    def _on_about_to_show(self) -> None:
        self.menu_opening.emit()
