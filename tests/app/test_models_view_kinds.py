"""The Models list is for chat models: embedding models found on disk (``kind`` "embedding") are not listed, and
the status line says how many were left out."""

from __future__ import annotations

from typing import Any

import pytest

from app.model.models_view import ModelsView

pytestmark = pytest.mark.gui


def _model(name: str, kind: str) -> dict[str, Any]:
    return {
        "name": name,
        "path": f"/models/{name}",
        "source": "huggingface",
        "format": "safetensors",
        "runnable": True,
        "fits": "yes",
        "kind": kind,
    }


def test_embedding_models_are_hidden_from_the_chat_model_list(qtbot: Any) -> None:
    view = ModelsView()
    qtbot.add_widget(view)
    view.show_models(
        [
            _model("Qwen3-0.6B", "chat"),
            _model("bge-small-en-v1.5", "embedding"),
            _model("Qwen3-Embedding-0.6B", "embedding"),
            {**_model("old-scan", "chat"), "kind": None},
        ]
    )
    tree = view._tree
    names = [tree.topLevelItem(i).text(0) for i in range(tree.topLevelItemCount())]
    assert names == ["Qwen3-0.6B", "old-scan"]
    assert "(2 embedding models not listed)" in view._status.text()
    view.show_models([_model("Qwen3-0.6B", "chat")])
    assert "embedding" not in view._status.text()
