"""The model pane's "This computer" box: the CPU, memory and GPUs the engine can use, in plain words."""

from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGroupBox, QLabel, QVBoxLayout, QWidget

from app.formatting import format_bytes


class HardwareBox(QGroupBox):
    """Shows what hardware detection found (the bridge's ``hardware_detected``)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("This computer", parent)
        self._hardware_label = QLabel("Detecting hardware…")
        self._hardware_label.setObjectName("hardwareLabel")
        self._hardware_label.setWordWrap(True)
        self._hardware_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.addWidget(self._hardware_label)

    def show_hardware(self, info: Any) -> None:
        """Describe an ``engine.api.HardwareInfo`` (None: detection failed)."""
        self._hardware_label.setText(describe_hardware(info))


def describe_hardware(info: Any) -> str:
    """Rich text for a ``hardware.detect()`` result, in plain words."""
    if info is None:
        return "Hardware could not be detected; the engine picks the device when it loads."
    features = [name for name, present in (("AVX2", info.avx2), ("AVX-512", info.avx512),
                                            ("AVX-512 BF16", info.avx512_bf16), ("AMX", info.amx)) if present]
    lines = [f"<b>CPU</b>: {html.escape(str(info.cpu_model))}, {info.physical_cores} cores"
             + (f" ({', '.join(features)})" if features else ""),
             (f"<b>Memory</b>: {format_bytes(info.ram_available_bytes)} free of "
              f"{format_bytes(info.ram_total_bytes)}")]
    if info.gpus:
        for gpu in info.gpus:
            lines.append(f"<b>GPU {gpu.index}</b>: {html.escape(str(gpu.name))}, "
                         f"{format_bytes(gpu.free_bytes)} free of {format_bytes(gpu.total_bytes)}")
    else:
        lines.append("<b>GPU</b>: none usable")
    if info.gpu_reason:
        lines.append(f"<span style='color: #757575'>{html.escape(str(info.gpu_reason))}</span>")
    return "<br>".join(lines)
