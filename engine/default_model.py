"""``python -m engine.default_model``: convert the bundled default model once (``engine/loading/default_model.py``)."""

from engine.loading.default_model import main

if __name__ == "__main__":
    raise SystemExit(main())
