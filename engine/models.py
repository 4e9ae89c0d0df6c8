"""``python -m engine.models``: list the models already on disk (``engine/loading/discovery.py``)."""

from engine.loading.discovery import main

if __name__ == "__main__":
    raise SystemExit(main())
