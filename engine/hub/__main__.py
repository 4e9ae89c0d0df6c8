"""``python -m engine.hub``: see :mod:`engine.hub.cli`."""

import sys

from engine.hub.cli import main

sys.exit(main())
