"""``python -m engine.serve``: the OpenAI-compatible server (``engine/serving/``)."""

from engine.serving.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
