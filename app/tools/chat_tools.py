"""Tools in the chats: the one MCP host the window owns, each chat's choice of tools, and the tools replies' specs.

No widgets but the Tools button it fills (:class:`~app.tools.tools_button.ToolsButton`). :class:`ChatTools` keeps:

* one :class:`~engine.mcp.host.McpHost` over the data folder's ``mcp.json``, shared by every chat. It is made when
  a chat first needs it and made again when the file changed (Settings → Tools (MCP) edits it); a server starts
  when the first chat that uses it is shown or sends (``EngineBridge.measure_tools`` and the tools reply's thread
  start it, never the GUI thread);
* each chat's choice (:mod:`app.data.tool_steps`): tools on or off, and the servers and single tools turned off
  for it (the button's menu lists each server's tools, checkable);
* what the chat's tools cost: their count and their definitions' prompt tokens, measured with the loaded model's
  chat template (``tools_measured``), shown on the button and added to the context meter's count; a tool turned
  off is neither counted nor offered;
* the step limit and the tool-call timeout of Settings → Tools (MCP) (``settings.ini``), read as each reply
  starts;
* one :class:`~app.tools.approval_dialog.GuiApprover` per chat, so that stopping one chat's reply denies only its
  own open question.

:meth:`spec_for` is the :class:`~app.chat.reply_controller.ReplyController`'s ``tool_spec``: it gives a chat that
uses tools the spec its reply runs with (``EngineBridge.submit_tools``); :meth:`steps_for` gives the transcript a
reply's stored steps.

The MCP SDK is never imported on the GUI thread: the spec carries :meth:`ChatTools.host`, which the measuring and
reply threads call, and the first call makes the host (and loads the SDK).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QTimer, Signal, Slot
from PySide6.QtWidgets import QWidget

from app import log
from app.data.conversations import Message
from app.data.settings import Settings
from app.data.storage import Storage
from app.data.tool_steps import ToolsChoice, ToolStepRecord, ToolStepStore
from app.tools.approval_dialog import GuiApprover
from app.tools.tools_button import ToolsButton
from engine.mcp.approvals import FILE_NAME as APPROVALS_FILE
from engine.mcp.approvals import ApprovalStore
from engine.mcp.config import FILE_NAME, McpConfig, McpConfigError, load_config

if TYPE_CHECKING:
    from app.bridge.engine_bridge import EngineBridge
    from app.bridge.tool_runs import ToolRunSpec, ToolsMeasure
    from app.bridge.types import ModelInfo
    from app.chat.chat_pane import ChatPane
    from app.chat.reply_controller import ReplyController
    from engine.mcp.host import McpHost


class ChatTools(QObject):
    """See the module docstring.

    Signals:
        changed(int): a chat's tools choice or their measure changed (its id).
        asked(ApprovalDialog): an approval dialog opened, for any chat.

    Args:
        data_dir: holds ``mcp.json`` and the "always" answers (``mcp_approvals.json``).
        bridge: measures the tools and runs the tools replies.
        storage: the conversation database (the chats' choices, the replies' steps).
        window: the approval dialogs' parent.
    """

    changed = Signal(int)
    asked = Signal(object)

    def __init__(self, data_dir: Path, bridge: EngineBridge, storage: Storage, window: QWidget) -> None:
        super().__init__(window)
        self.path = Path(data_dir) / FILE_NAME
        self.approvals = ApprovalStore(Path(data_dir) / APPROVALS_FILE)
        self.settings = Settings(Path(data_dir))  # the same file as the window's: changes show at once
        self._bridge = bridge  # the window is parent(): a reference of our own would keep a deleted one's wrapper
        self._store = ToolStepStore(storage)
        self._host: McpHost | None = None
        self._host_key: tuple[int, int] | None = None
        self._host_lock = threading.Lock()  # host() runs on worker threads
        self._closed = False
        self._approvers: dict[int, GuiApprover] = {}
        self._measures: dict[int, ToolsMeasure] = {}
        self._offered: dict[int, tuple[tuple[str, str], ...]] = {}  # kept while a chat's tools are measured again
        self._closing: list[threading.Thread] = []
        self._current: int | None = None
        self.button = ToolsButton()
        self.button.enabled_toggled.connect(self._on_enabled_toggled)
        self.button.server_toggled.connect(self._on_server_toggled)
        self.button.tool_toggled.connect(self._on_tool_toggled)
        self.button.menu_opening.connect(self._refresh)
        bridge.signals.tools_measured.connect(self._on_measured)
        bridge.signals.model_loaded.connect(self._on_model_loaded)

    def attach(self, pane: ChatPane, replies: ReplyController) -> None:
        """Wire the chat: the button by the message box, the replies' steps in the transcript, tools replies."""
        pane.composer.add_button(self.button)
        pane.view.set_steps_provider(self.steps_for)
        pane.conversation_shown.connect(self.show)
        replies.tool_spec = self.spec_for
        pane.context_meter.tool_tokens = self.prompt_tokens
        self.changed.connect(pane.context_meter.on_tools_changed)
        self._bridge.signals.tool_step.connect(replies._on_tool_step)  # as the window connects the other deltas
        current = pane.current_conversation
        self.show(current.id if current is not None else None)

    # -- the chats' choices ------------------------------------------------------------------------

    def config(self) -> McpConfig:
        """``mcp.json`` as it is now (no servers when it cannot be read: Settings says why)."""
        try:
            return load_config(self.path)
        except McpConfigError as exc:
            log.ui.warning("mcp.json: %s", exc)
            return McpConfig()

    def server_names(self) -> list[str]:
        """The servers ``mcp.json`` has enabled, in its order."""
        return [name for name, server in self.config().servers.items() if server.enabled]

    def choice(self, conversation_id: int) -> ToolsChoice:
        return self._store.choice(conversation_id)

    def set_choice(self, conversation_id: int, choice: ToolsChoice) -> None:
        """Store a chat's choice; its tools are measured again (which starts their servers)."""
        self._store.set_choice(conversation_id, choice)
        self._measures.pop(conversation_id, None)
        self.measure(conversation_id)
        self.changed.emit(conversation_id)
        if conversation_id == self._current:
            self._refresh()

    def active_servers(self, conversation_id: int) -> list[str]:
        """The servers a chat's replies may use now ([] when its tools are off)."""
        choice = self.choice(conversation_id)
        return [n for n in self.server_names() if n not in choice.servers_off] if choice.enabled else []

    def measure_of(self, conversation_id: int) -> ToolsMeasure | None:
        return self._measures.get(conversation_id)

    def prompt_tokens(self, conversation_id: int) -> int:
        """The prompt tokens the definitions of the chat's tools add to its replies, as the engine's tool loop
        renders them with the loaded model's chat template; 0 when it uses none, or before they are counted."""
        measure = self._measures.get(conversation_id)
        if measure is None or not measure.prompt_tokens or not self.active_servers(conversation_id):
            return 0
        return measure.prompt_tokens

    def measure(self, conversation_id: int) -> None:
        """Start the chat's servers and count its tools' prompt tokens, in the background (``changed`` follows)."""
        spec = self.spec_for(conversation_id)
        if spec is not None:
            self._bridge.measure_tools(conversation_id, spec)

    def show(self, conversation_id: int | None) -> None:
        """The chat pane shows ``conversation_id``: the button follows it, and its servers start if it uses tools."""
        self._current = conversation_id
        if conversation_id is not None and conversation_id not in self._measures:
            self.measure(conversation_id)
        self._refresh()

    def summary(self, conversation_id: int) -> tuple[str, str]:
        """The button's text and the sentence behind it, for a chat."""
        if not self.choice(conversation_id).enabled:
            return "Tools: off", ""
        if not self.active_servers(conversation_id):
            return "Tools: no servers", "Tools are on, but no MCP server is on for this chat."
        measure = self._measures.get(conversation_id)
        if measure is None:
            return "Tools: starting…", "Starting this chat's MCP servers…"
        count, offered = len(measure.tools), len(measure.offered)
        tools = f"{count} tool{'' if count == 1 else 's'}" if count == offered else f"{count} of {offered} tools"
        problems = "".join(f"\nNot available: {p}" for p in measure.problems)
        if measure.prompt_tokens is None:
            return tools, f"{tools} in this chat (load a model to count their prompt tokens).{problems}"
        return (f"{tools} · {measure.prompt_tokens} tokens",
                f"{tools} in this chat; their definitions take {measure.prompt_tokens} prompt tokens.{problems}")

    # -- replies -----------------------------------------------------------------------------------

    def spec_for(self, conversation_id: int) -> ToolRunSpec | None:
        """What a reply in the chat runs its tools with; None when the chat uses none."""
        from app.bridge.tool_runs import ToolRunSpec

        servers = self.active_servers(conversation_id)
        if not servers:
            return None
        approver = self._approvers.get(conversation_id)
        if approver is None:
            window = self.parent()
            approver = GuiApprover(self.approvals, window if isinstance(window, QWidget) else None)
            self._approvers[conversation_id] = approver
            approver.asked.connect(self.asked)
        choice = self.choice(conversation_id)
        return ToolRunSpec(self.host, servers, approver, self.approvals, approver.deny_all,
                           max_steps=self.settings.tool_max_steps,
                           call_timeout_s=float(self.settings.tool_call_timeout_s),
                           tools_off=frozenset(p for p in choice.tools_off if p[0] in servers))

    def steps_for(self, message: Message) -> list[ToolStepRecord]:
        """A reply's stored tool steps ([] for a message never stored, or once the window closed the database: a
        theme change still redraws the transcript of a closed window)."""
        if message.id is None or self._store.storage.is_closed:
            return []
        return self._store.steps(message.id)

    def host(self) -> McpHost:
        """The shared host over ``mcp.json`` as it is now (a new one when the file changed). Called on worker
        threads (the first call loads the MCP SDK); raises RuntimeError once :meth:`close` ran."""
        from engine.mcp.host import McpHost  # the MCP SDK loads with the first chat that uses tools

        try:
            stat = self.path.stat()
            key: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            key = None
        with self._host_lock:
            if self._closed:
                raise RuntimeError("the window closed")
            if self._host is None or key != self._host_key:
                self._close_host()
                self._host, self._host_key = McpHost(self.config()), key
            return self._host

    def close(self, timeout_s: float = 10.0) -> bool:
        """Deny every open question and stop the host's servers; whether they stopped within ``timeout_s``."""
        for approver in self._approvers.values():
            approver.deny_all()
        self._approvers.clear()
        with self._host_lock:
            self._closed = True
            self._close_host()
        for thread in self._closing:
            thread.join(timeout_s)
        return not any(t.is_alive() for t in self._closing)

    def _close_host(self) -> None:
        host, self._host = self._host, None
        if host is not None:  # off the GUI thread: stopping may wait for a server's process
            thread = threading.Thread(target=host.close, name="hearth-mcp-close", daemon=True)
            self._closing.append(thread)
            thread.start()

    # -- events ------------------------------------------------------------------------------------

    @Slot()
    def _refresh(self) -> None:
        if self._current is None or self._store.storage.is_closed:  # a late count after the window closed
            return
        choice = self.choice(self._current)
        servers = [(n, n not in choice.servers_off) for n in self.server_names()]
        tools: dict[str, list[tuple[str, bool]]] = {}
        for server, tool in self._offered.get(self._current, ()):
            tools.setdefault(server, []).append((tool, (server, tool) not in choice.tools_off))
        self.button.show_state(choice.enabled, servers, *self.summary(self._current), tools=tools)

    def _change_later(self, change: Callable[[ToolsChoice], ToolsChoice]) -> None:
        """Apply ``change`` to the shown chat's choice once the menu's signal returned: the action that emitted it
        goes when the menu is redrawn."""
        if self._current is not None:
            cid = self._current
            QTimer.singleShot(0, self, lambda: self.set_choice(cid, change(self.choice(cid))))

    @Slot(bool)
    def _on_enabled_toggled(self, enabled: bool) -> None:
        self._change_later(lambda choice: replace(choice, enabled=enabled))

    @Slot(str, bool)
    def _on_server_toggled(self, name: str, on: bool) -> None:
        self._change_later(lambda choice: replace(
            choice, servers_off=choice.servers_off - {name} if on else choice.servers_off | {name}))

    @Slot(str, str, bool)
    def _on_tool_toggled(self, server: str, tool: str, on: bool) -> None:
        pair = (server, tool)
        self._change_later(lambda choice: replace(
            choice, tools_off=choice.tools_off - {pair} if on else choice.tools_off | {pair}))

    @Slot(object, object)
    def _on_measured(self, key: object, measure: ToolsMeasure) -> None:
        if isinstance(key, int) and not self._closed:  # news the bridge posted before the window closed
            self._measures[key] = measure
            self._offered[key] = measure.offered
            self.changed.emit(key)
            if key == self._current:
                self._refresh()

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        self._measures.clear()  # counted with another model's template, or with none
        if self._current is not None and not self._closed:  # a load that ended as the window closed: storage is shut
            self.measure(self._current)
            self._refresh()
