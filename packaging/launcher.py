"""Entry script of the PyInstaller bundle (``packaging/hearth.spec``): runs ``app.__main__.main``.

``import app`` (through ``app.__main__``) applies ``app.qtfix`` before any window exists, exactly
as ``python -m app`` does.
"""

import multiprocessing
import sys

from app.__main__ import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a no-op unless a spawned child process starts the bundle
    sys.exit(main())
