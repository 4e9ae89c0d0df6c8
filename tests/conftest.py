"""Fixtures shared by the whole suite.

Loading the default model and starting a server are the suite's costly steps, so both are shared for the session:
``shared_default_llm`` keeps one engine per level and options, ``shared_server`` one server process per set of flags.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.engine.server_process import ServerProcess

REPO_ROOT = Path(__file__).resolve().parent.parent

# The suite's native builds (this CPU's, the bundle's copies) make every C++ warning an error, as ``make install`` does.
os.environ.setdefault("HEARTH_NATIVE_WERROR", "1")

#: Fixtures that load the default model or start a server: every test that uses one, directly or through another
#: fixture, is marked ``slow`` (it is, whenever it is the first to ask).
SLOW_FIXTURES = frozenset({"shared_default_llm", "shared_server", "default_hf_model"})


#: Fixture scopes set up once per module (or class): ``make test``'s two workers (``--dist loadgroup``) keep every test
#: of a module that uses one in one worker, so it is set up once, not once in each worker.
_MODULE_SCOPES = frozenset({"module", "class", "package"})


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in _MODULE_SCOPES for defs in info.name2fixturedefs.values())


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fuzz-mutants", type=int, default=None, metavar="N",
                     help="crafted model files per run of tests/reliability/test_crafted_files.py (default 300, or "
                          "HEARTH_FUZZ_MUTANTS); two thirds GGUF")


def pytest_configure(config: pytest.Config) -> None:
    # xdist registers its mark itself; runs without xdist (``-p no:xdist``) need it known too (--strict-markers)
    config.addinivalue_line("markers", "xdist_group(name): run these tests in one xdist worker (--dist loadgroup)")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        _share_the_cores(workers)


def _share_the_cores(workers: int) -> None:
    """Give each xdist worker its share of the cores for torch's threads, not all of them.

    The engine sets one torch thread per physical core (``hardware.configure_threads``, once per process). With two
    workers on two cores that is four threads, and an OpenMP region waits at its barrier for a thread the other
    worker has taken off its core: small ops (a sampler's masked_fill over the vocabulary) then took milliseconds.
    Measured on the draft-model speculation workload of ``test_speculative.py`` (100 sampled requests on the shared
    2 cores, load ~14): 70 s with two threads, 6.4 and 7.3 s with one.
    """
    from engine.system import hardware

    share = max(1, hardware.detect().physical_cores // workers)
    hardware.configure_threads(threads=share)
    # and the same share for the servers and scripts the tests start (they configure their own threads)
    os.environ[hardware.THREADS_ENV] = str(share)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    # The modules that check the default model against its HF twin share one worker, so the twin is loaded, and each
    # of its greedy references generated (tests/engine/hf_reference.py memoises them), once.
    against_hf = {module(item) for item in items if "default_hf_model" in getattr(item, "fixturenames", ())}
    for item in items:
        slow = bool(SLOW_FIXTURES & set(getattr(item, "fixturenames", ())))
        if slow:
            item.add_marker(pytest.mark.slow)
        # A module whose tests share a module-scoped fixture, or load the model or a server, runs in one worker:
        # split over two (``--dist load`` deals out the last tests one by one), each would set up its own copy.
        # xdist sends the groups first, largest first, and then the single tests that fill both workers to the end.
        if slow or _shares_a_module_fixture(item):
            group = "default_hf_model" if module(item) in against_hf else module(item)
            item.add_marker(pytest.mark.xdist_group(group))  # one group per test: two would make a third


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The converted default model, in the real user data dir (converted once per machine).

    ``make test`` converts it beforehand through ``python -m engine.default_model``; otherwise the
    first test that needs it pays for the conversion (~40 s).
    """
    from engine.loading.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root (the working directory for ``python -m`` subprocesses)."""
    return REPO_ROOT


@pytest.fixture(autouse=True)
def gc_on_the_gui_thread(request: pytest.FixtureRequest) -> Iterator[None]:
    """In a test with a QApplication (``qapp``/``qtbot``), cyclic garbage is collected on this, the GUI, thread only, as
    the app's ``GuiGarbageCollector`` (app/gui_gc.py) does: automatic collection is off for the test and its garbage
    (closed windows and dialogs) is collected when it ends. Left on, a collection that falls in a worker thread (an
    import's JSON parse, a model load) destroys Qt objects off the GUI thread, and the process dies: a fresh-clone run
    lost an xdist worker to a segfault in ``test_app_imports.py`` that way."""
    import gc

    if not {"qapp", "qtbot"} & set(request.fixturenames):
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect()
        if was_enabled:
            gc.enable()


@pytest.fixture(autouse=True)
def data_dir_env_kept() -> Iterator[None]:
    """``HEARTH_DATA_DIR`` as it was before each test. ``main(["--data-dir", ...])`` sets it for the process, as a
    user's command line should; a test that runs ``main`` in-process would otherwise move every later test's data
    folder, and its default model, into its own temporary folder."""
    before = os.environ.get("HEARTH_DATA_DIR")
    yield
    if before is None:
        os.environ.pop("HEARTH_DATA_DIR", None)
    else:
        os.environ["HEARTH_DATA_DIR"] = before


@pytest.fixture(scope="session", autouse=True)
def no_embedding_models_on_disk(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The document index's ``auto`` embedder looks for embedding models in an empty home, not the user's: what it
    picks (WordLlama) must not depend on the machine (tests that want one give it a home of their own)."""
    from engine.docs import embedders

    embedders.search_home = tmp_path_factory.mktemp("no-embedding-models")


@pytest.fixture(scope="session", autouse=True)
def native_decode_step() -> None:
    """Build (or load) the native decode step before any engine starts, so that no test sees it appear mid-run.

    The first build on a machine takes some seconds; later sessions load it from the data dir.
    """
    import torch

    from engine.model.native import EXTENSION, native_problem

    if native_problem(torch.device("cpu"), torch.float32) is None:
        EXTENSION.start(wait=True)


@pytest.fixture(scope="session")
def shared_default_llm(default_model_dir: Path) -> Iterator[Callable[..., Any]]:
    """``shared_default_llm(level, **options)``: the default model at ``level`` ("fp32", "bf16", "int8", "int4"),
    loaded once per session for each set of options, stepped by the caller (no loop thread), closed at the end.

    ``kv_cache_bytes`` defaults to 64 MiB, so callers that ask only for a level share one engine. A test may submit
    requests and step them until all have finished (cancelled ones too), and may reset the prefix cache: later tests
    then find the engine as it was, bar its prefix cache and rolling metrics. A test that leaves requests unfinished,
    closes the engine, changes its config, kernels or speculation, or needs the loop thread loads its own ``LLM``.
    """
    from engine import LLM

    engines: dict[tuple[Any, ...], Any] = {}

    def get(level: str, **options: Any) -> Any:
        options.setdefault("kv_cache_bytes", 64 << 20)
        key = (level, *sorted(options.items()))
        if key not in engines:
            engines[key] = LLM("default", quantization=level, start_loop=False, **options)
        llm = engines[key]
        assert not llm.engine.has_work(), "a test left requests in a shared engine"
        return llm

    yield get
    for llm in engines.values():
        llm.close()


@pytest.fixture(scope="session")
def shared_server(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ServerProcess]]:
    """``shared_server(api_key, *flags)``: ``python -m engine.serve`` on the default model with these flags, started
    on first use and kept for the session (``tests/engine/server_process.py``: ``KEYED``, ``OPEN``)."""
    from tests.engine.server_process import ServerPool

    pool = ServerPool(repo_root, tmp_path_factory.mktemp("servers"))
    try:
        yield pool.get
    finally:
        pool.close()
