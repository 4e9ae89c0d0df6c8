"""The headless commands: ``hearth service install|status|uninstall`` writing a systemd user unit, ``hearth serve``
refusing bad flags in words, and the server's log in the data folder."""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

import pytest

from engine.serving import headless


@pytest.fixture
def no_systemctl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A PATH without systemctl, as in a container: the unit is written, nothing is started."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


@pytest.mark.skipif(not headless.sys.platform.startswith("linux"), reason="systemd user units are Linux's")
def test_service_install_writes_a_unit_that_runs_the_headless_server(
    no_systemctl: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config"
    models = tmp_path / "models"
    assert headless.service("install", ["--models-dir", str(models), "--port", "11434"], config) == 0
    unit = config / "systemd" / "user" / "hearth.service"
    text = unit.read_text()
    assert "ExecStart=" in text and "-m engine.serve --models-dir" in text and str(models) in text
    assert "Restart=on-failure" in text and "WantedBy=default.target" in text
    assert "not started" in capsys.readouterr().err
    headless.service("status", [], config)
    assert "hearth.service:" in capsys.readouterr().out
    assert headless.service("uninstall", [], config) == 0
    assert not unit.exists()
    headless.service("status", [], config)
    assert "not installed" in capsys.readouterr().out


def test_serve_refuses_a_models_dir_that_is_not_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert headless.bundle_main(["serve", "--models-dir", str(tmp_path / "missing"), "--port", "0"]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_serve_refuses_a_bad_keep_alive_in_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert headless.bundle_main(["serve", "--models-dir", str(tmp_path), "--keep-alive", "soon"]) == 2
    assert "keep_alive" in capsys.readouterr().err


def test_the_log_goes_to_the_data_folder_and_rotates(tmp_path: Path) -> None:
    root = logging.getLogger()
    level = root.level
    path = headless.log_to_data_folder("info", tmp_path)
    handler = next(h for h in root.handlers if isinstance(h, logging.handlers.RotatingFileHandler)
                   and Path(h.baseFilename) == path)
    try:
        handler.maxBytes = 2000  # rotate after a few lines rather than after megabytes
        for i in range(100):
            logging.getLogger("engine.serving.test").info("line %d of the server's log", i)
        handler.flush()
        assert path == tmp_path / "logs" / "server.log" and path.is_file()
        assert (tmp_path / "logs" / "server.log.1").is_file()
        assert not (tmp_path / "logs" / f"server.log.{headless.LOG_BACKUPS + 1}").exists()
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(level)


def test_embedding_model_folders_named_on_the_command_line_become_embedding_entries(tmp_path: Path) -> None:
    """``--embedding-model`` with ``--models-dir``: each folder an entry of the pool, refused in words when it is
    not an embedding model."""
    from tests.engine.embedding_models import build_tiny_embedder

    folder, _ = build_tiny_embedder("bert", tmp_path / "tiny-bert", pooling="cls")
    (entry,) = headless.embedding_entries([folder])
    assert (entry.name, entry.kind, entry.family, entry.path) == ("tiny-bert", "embedding", "bert", str(folder))
    assert "tiny-bert:latest" in entry.aliases and entry.size_bytes > 0
    with pytest.raises(FileNotFoundError, match="no embedding model at"):
        headless.embedding_entries([tmp_path / "missing"])
    (tmp_path / "chat").mkdir()
    (tmp_path / "chat" / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="embedding models run as"):
        headless.embedding_entries([tmp_path / "chat"])
