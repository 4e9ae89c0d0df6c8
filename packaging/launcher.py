"""Entry script of the PyInstaller bundle (``packaging/hearth.spec``): runs ``app.__main__.main``, or with
``serve``/``service`` the headless server (``engine.serving.headless``), which never imports Qt.

``import app`` (through ``app.__main__``) applies ``app.qtfix`` before any window exists, exactly
as ``python -m app`` does.
"""

import multiprocessing
import sys

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a no-op unless a spawned child process starts the bundle
    if sys.argv[1:2] in (["serve"], ["service"]):  # headless: the server without importing Qt at all
        from engine.serving.headless import bundle_main

        sys.exit(bundle_main(sys.argv[1:]))
    from app.__main__ import main

    sys.exit(main())
