"""PyInstaller runtime hook: torch's OpenMP threads sleep while they wait, instead of spinning.

The engine runs torch with one thread per physical core. GNU OpenMP's worker threads spin between parallel regions
by default; when another program holds some of the cores, a region then waits for a spinning thread that is not
running, every op of every step. On a busy 2-core machine a load of the default model took 40 to 60 s and a short
reply 5 to 12 s that way, against 8 to 10 s and under 1 s with ``OMP_WAIT_POLICY=PASSIVE`` (docs/PACKAGING.md).
libgomp reads the variable once, when ``import torch`` loads it; this hook runs before any bundled module. A value
set by the user wins.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
