"""The Model pane's words for a load's stages: the engine reports short stage names (``engine/core/llm.py``,
``engine/loading/loader.py``), the pane shows what each one does, with its count where it has one. And its words
for the native decode step's build (:class:`~app.bridge.types.NativeBuild`), which goes on after a load."""

from __future__ import annotations

from app.bridge.types import NativeBuild

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


def native_build_text(build: NativeBuild, precision: str) -> str:
    """The build of the native decode step in words, for a model running at ``precision`` ("int4"); "" when there is
    nothing to say (no build was asked for)."""
    runs = f"runs {precision}" if precision else "runs"
    if build.state == "building":
        return f"Building the fast decode step… ({runs} meanwhile)"
    if build.state == "ready":
        return "The fast decode step is ready: replies run faster from now on."
    if build.state == "failed":
        why = build.problem.rstrip(".") or "no reason given"
        return f"The fast decode step could not be built ({why}); the model {runs} without it."
    return ""
