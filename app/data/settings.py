"""The user's preferences, in an INI file in the data dir (``settings.ini``), through QSettings.

Keeping the file under the data dir (rather than QSettings' per-user default) means a test's or a
portable install's temporary data dir also isolates its settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSettings

from app.data.private_files import create_private

#: Colour themes the user can pick (:func:`app.window.theme.apply_theme` applies one).
THEMES = ("system", "light", "dark")
FILE_NAME = "settings.ini"
#: Font sizes the user can pick, in points; 0 means the system's size.
MIN_FONT_SIZE, MAX_FONT_SIZE = 0, 32
#: Generation defaults, used by every conversation that does not set its own.
#: ``repeat_last_n`` is the repetition penalty's window in tokens (-1: the whole history; 0: off), llama.cpp's 64.
DEFAULT_GENERATION: dict[str, Any] = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 512,
                                      "repetition_penalty": 1.0, "repeat_last_n": 64}
#: The "Serve on localhost" port until the user picks another.
DEFAULT_SERVER_PORT = 8000
#: How many replies with tool calls one answer may take, and how long one tool call may run (Settings → Tools).
DEFAULT_TOOL_STEPS, MIN_TOOL_STEPS, MAX_TOOL_STEPS = 8, 1, 50
DEFAULT_TOOL_TIMEOUT_S, MIN_TOOL_TIMEOUT_S, MAX_TOOL_TIMEOUT_S = 30, 1, 3600


class Settings:
    """Typed access to the settings file. Each setter writes through to disk on :meth:`sync`.

    Args:
        data_dir: the folder holding ``settings.ini``.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FILE_NAME
        create_private(self.path)  # the folder 0700 and the file 0600: Qt keeps the mode when it rewrites it
        self._qsettings = QSettings(str(self.path), QSettings.Format.IniFormat)

    def sync(self) -> None:
        """Write pending changes to the file (created again, private, if it was removed meanwhile)."""
        if not self.path.exists():
            create_private(self.path)
        self._qsettings.sync()

    # -- appearance -------------------------------------------------------------------------------

    @property
    def theme(self) -> str:
        value = str(self._qsettings.value("appearance/theme", "system"))
        return value if value in THEMES else "system"

    @theme.setter
    def theme(self, value: str) -> None:
        if value not in THEMES:
            raise ValueError(f"theme must be one of {', '.join(THEMES)}, got {value!r}")
        self._qsettings.setValue("appearance/theme", value)

    @property
    def font_size(self) -> int:
        """The chat's font size in points; 0 for the system's."""
        return min(max(self._int("appearance/font_size", 0), MIN_FONT_SIZE), MAX_FONT_SIZE)

    @font_size.setter
    def font_size(self, value: int) -> None:
        if not MIN_FONT_SIZE <= value <= MAX_FONT_SIZE:
            raise ValueError(f"font size must be in {MIN_FONT_SIZE}..{MAX_FONT_SIZE}, got {value}")
        self._qsettings.setValue("appearance/font_size", int(value))

    # -- chat defaults ----------------------------------------------------------------------------

    @property
    def default_model(self) -> str:
        """The model path put in the Model pane on start; "" for Hearth's bundled default model."""
        return str(self._qsettings.value("chat/default_model", ""))

    @default_model.setter
    def default_model(self, value: str) -> None:
        self._qsettings.setValue("chat/default_model", value.strip())

    @property
    def default_preset_id(self) -> int | None:
        """The preset new conversations start from; None for no system prompt."""
        value = self._int("chat/default_preset_id", 0)
        return value or None

    @default_preset_id.setter
    def default_preset_id(self, value: int | None) -> None:
        self._qsettings.setValue("chat/default_preset_id", int(value or 0))

    @property
    def generation(self) -> dict[str, Any]:
        """Default temperature, top-p, max tokens, repetition penalty and its window (a stored window below -1, which
        the engine would refuse, reads as -1: the whole history)."""
        return {
            "temperature": self._float("generation/temperature", DEFAULT_GENERATION["temperature"]),
            "top_p": self._float("generation/top_p", DEFAULT_GENERATION["top_p"]),
            "max_tokens": self._int("generation/max_tokens", DEFAULT_GENERATION["max_tokens"]),
            "repetition_penalty": self._float("generation/repetition_penalty",
                                              DEFAULT_GENERATION["repetition_penalty"]),
            "repeat_last_n": max(-1, self._int("generation/repeat_last_n", DEFAULT_GENERATION["repeat_last_n"])),
        }

    @generation.setter
    def generation(self, params: dict[str, Any]) -> None:
        for name in DEFAULT_GENERATION:
            if name in params:
                self._qsettings.setValue(f"generation/{name}", params[name])

    # -- models and serving -----------------------------------------------------------------------

    @property
    def last_model(self) -> str:
        """The model loaded last ("default" for the bundled one; "" before any load)."""
        return str(self._qsettings.value("models/last_model", ""))

    @last_model.setter
    def last_model(self, value: str) -> None:
        self._qsettings.setValue("models/last_model", value.strip())

    @property
    def auto_load(self) -> bool:
        """Whether the last model loads by itself when Hearth starts (on unless the user turned it off: after a
        restart the chat can answer without a visit to the Models pane)."""
        return self._bool("models/auto_load", True)

    @auto_load.setter
    def auto_load(self, value: bool) -> None:
        self._qsettings.setValue("models/auto_load", bool(value))

    @property
    def model_folders(self) -> list[str]:
        """Folders the user added to the Models list."""
        return [str(f) for f in self._json("models/folders", []) if isinstance(f, str)]

    @model_folders.setter
    def model_folders(self, folders: list[str]) -> None:
        self._qsettings.setValue("models/folders", json.dumps(list(dict.fromkeys(folders))))

    @property
    def download_folder(self) -> str:
        """The folder Discover downloads into; "" for the Hugging Face cache."""
        return str(self._qsettings.value("models/download_folder", "") or "")

    @download_folder.setter
    def download_folder(self, folder: str) -> None:
        self._qsettings.setValue("models/download_folder", folder.strip())

    def context_length(self, spec: str) -> int:
        """The context length chosen for model ``spec``; 0 for the default."""
        value = self._json("models/context_lengths", {}).get(spec, 0)
        return int(value) if isinstance(value, int) else 0

    def set_context_length(self, spec: str, value: int) -> None:
        lengths = self._json("models/context_lengths", {})
        lengths = lengths if isinstance(lengths, dict) else {}
        lengths[spec] = int(value)
        self._qsettings.setValue("models/context_lengths", json.dumps(lengths))

    @property
    def overflow(self) -> str:
        """What to drop from a chat longer than the context (``app.bridge.types.OVERFLOW_POLICIES``)."""
        return str(self._qsettings.value("models/overflow", "truncate_middle"))

    @overflow.setter
    def overflow(self, value: str) -> None:
        self._qsettings.setValue("models/overflow", value)

    @property
    def repeatable(self) -> bool:
        """Whether the engine loads with repeatable (bitwise deterministic) replies; on unless turned off."""
        return self._bool("models/repeatable", True)

    @repeatable.setter
    def repeatable(self, value: bool) -> None:
        self._qsettings.setValue("models/repeatable", bool(value))

    @property
    def models_kept(self) -> int:
        """How many models stay loaded (1 to 4; 1: loading another frees the one in use)."""
        return min(max(self._int("models/kept_loaded", 1), 1), 4)

    @models_kept.setter
    def models_kept(self, value: int) -> None:
        if not 1 <= value <= 4:
            raise ValueError(f"models kept loaded must be 1 to 4, got {value}")
        self._qsettings.setValue("models/kept_loaded", int(value))

    @property
    def idle_unload_s(self) -> float | None:
        """Seconds an idle model stays loaded; None (stored as 0) for ever."""
        value = self._float("models/idle_unload_s", 0.0)
        return value if value > 0 else None

    @idle_unload_s.setter
    def idle_unload_s(self, value: float | None) -> None:
        self._qsettings.setValue("models/idle_unload_s", float(value or 0.0))

    @property
    def server_enabled(self) -> bool:
        """Whether "Serve on localhost" is on."""
        return self._bool("server/enabled", False)

    @server_enabled.setter
    def server_enabled(self, value: bool) -> None:
        self._qsettings.setValue("server/enabled", bool(value))

    @property
    def server_port(self) -> int:
        port = self._int("server/port", DEFAULT_SERVER_PORT)
        return port if 1 <= port <= 65535 else DEFAULT_SERVER_PORT

    @server_port.setter
    def server_port(self, value: int) -> None:
        self._qsettings.setValue("server/port", int(value))

    # -- tools ------------------------------------------------------------------------------------

    @property
    def tool_max_steps(self) -> int:
        """How many replies with tool calls one answer may take before the tool loop stops."""
        value = self._int("tools/max_steps", DEFAULT_TOOL_STEPS)
        return value if MIN_TOOL_STEPS <= value <= MAX_TOOL_STEPS else DEFAULT_TOOL_STEPS

    @tool_max_steps.setter
    def tool_max_steps(self, value: int) -> None:
        if not MIN_TOOL_STEPS <= value <= MAX_TOOL_STEPS:
            raise ValueError(f"the step limit must be in {MIN_TOOL_STEPS}..{MAX_TOOL_STEPS}, got {value}")
        self._qsettings.setValue("tools/max_steps", int(value))

    @property
    def tool_call_timeout_s(self) -> int:
        """How many seconds one tool call may run before it is abandoned (and the model told so)."""
        value = self._int("tools/call_timeout_s", DEFAULT_TOOL_TIMEOUT_S)
        return value if MIN_TOOL_TIMEOUT_S <= value <= MAX_TOOL_TIMEOUT_S else DEFAULT_TOOL_TIMEOUT_S

    @tool_call_timeout_s.setter
    def tool_call_timeout_s(self, value: int) -> None:
        if not MIN_TOOL_TIMEOUT_S <= value <= MAX_TOOL_TIMEOUT_S:
            raise ValueError(f"the tool call timeout must be in {MIN_TOOL_TIMEOUT_S}..{MAX_TOOL_TIMEOUT_S} s, "
                             f"got {value}")
        self._qsettings.setValue("tools/call_timeout_s", int(value))

    # -- window -----------------------------------------------------------------------------------

    @property
    def geometry(self) -> QByteArray | None:
        return self._bytes("window/geometry")

    @geometry.setter
    def geometry(self, value: QByteArray) -> None:
        self._qsettings.setValue("window/geometry", value)

    @property
    def window_state(self) -> QByteArray | None:
        """``QMainWindow.saveState()``: where the panes are."""
        return self._bytes("window/state")

    @window_state.setter
    def window_state(self, value: QByteArray) -> None:
        self._qsettings.setValue("window/state", value)

    # -- helpers ----------------------------------------------------------------------------------

    def _int(self, key: str, default: int) -> int:
        try:
            return int(self._qsettings.value(key, default))  # type: ignore[call-overload]
        except (TypeError, ValueError):
            return default

    def _float(self, key: str, default: float) -> float:
        try:
            return float(self._qsettings.value(key, default))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return default

    def _bool(self, key: str, default: bool) -> bool:
        value = self._qsettings.value(key, default)
        return value.lower() == "true" if isinstance(value, str) else bool(value)

    def _json(self, key: str, default: Any) -> Any:
        try:
            value = json.loads(str(self._qsettings.value(key, "")))
        except ValueError:
            return default
        return value if isinstance(value, type(default)) else default

    def _bytes(self, key: str) -> QByteArray | None:
        value = self._qsettings.value(key)
        return value if isinstance(value, QByteArray) and not value.isEmpty() else None
