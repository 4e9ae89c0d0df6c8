"""The Model pane's words for a load's stages: the engine reports short stage names (``engine/core/llm.py``,
``engine/loading/loader.py``), the pane shows what each one does, with its count where it has one."""

from __future__ import annotations

#: The engine's stage names, in the order a load reports them, and what the pane says for each.
STAGE_WORDS = {
    "verify": "Verifying the model file",
    "convert": "Converting",
    "save": "Saving the converted model",
    "validate": "Checking the model files",
    "read weights": "Reading the weights",
    "quantize": "Building the layers",
    "tune": "Tuning kernels",
    "warm up": "Warming up",
}


def load_stage_text(stage: str, fraction: float) -> str:
    """``stage`` in words: "convert 3/272" as "Converting… 3/272", "tune lm_head 49152x576" as "Tuning kernels…
    lm_head 49152x576"; a finished load's stage ("Ready", "Connected") as it is."""
    for name, words in STAGE_WORDS.items():
        if stage == name or stage.startswith(name + " "):
            rest = stage[len(name):].strip()
            return f"{words}… {rest}" if rest else f"{words}…"
    text = stage[:1].upper() + stage[1:]
    return f"{text}…" if fraction < 1.0 else text
