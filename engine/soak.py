"""``python -m engine.soak``: memory under a long mixed workload (``engine/tools/soak.py``)."""

from engine.tools.soak import main

if __name__ == "__main__":
    raise SystemExit(main())
