"""``python -m engine.bench``: the engine benchmark (``engine/tools/bench.py``)."""

from engine.tools.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
