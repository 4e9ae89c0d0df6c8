#!/usr/bin/env bash
# Build the one-folder bundle dist/Hearth/ (Hearth + Python + torch + Qt + the default model).
#
#   packaging/build.sh            # from the repo root, after `make install`
#   PYTHON=/other/python packaging/build.sh
#
# It installs PyInstaller (packaging/build-requirements.txt) into the venv, converts the default model
# if that has not happened yet, and runs PyInstaller on packaging/hearth.spec. On Linux it then checks with
# ldd that the bundle carries every library its Qt plugins load (packaging/check_libs.py) and fails, printing
# the apt-get command, when one is missing on the build machine, and that it holds only what
# packaging/bundle-contents.txt declares (packaging/check_contents.py). See docs/PACKAGING.md.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
DIST=${DIST:-dist}
WORK=${WORK:-build/pyinstaller}

if [[ ! -x $PYTHON ]]; then
    echo "error: $PYTHON not found; run \`make install\` first" >&2
    exit 1
fi
if ! "$PYTHON" -m pip install --quiet --disable-pip-version-check -r packaging/build-requirements.txt; then
    echo "error: could not install PyInstaller (packaging/build-requirements.txt)" >&2
    exit 1
fi
"$PYTHON" -m engine.default_model   # no-op once converted

started=$SECONDS
"$PYTHON" -m PyInstaller --noconfirm --log-level WARN --distpath "$DIST" --workpath "$WORK" packaging/hearth.spec
if [[ $(uname -s) == Linux ]] && ! "$PYTHON" packaging/check_libs.py "$DIST/Hearth"; then
    echo "error: $DIST/Hearth is incomplete (see above); it was left in place for inspection" >&2
    exit 1
fi
if [[ $(uname -s) == Linux ]] && ! "$PYTHON" packaging/check_contents.py "$DIST/Hearth"; then
    echo "error: $DIST/Hearth holds what packaging/bundle-contents.txt does not declare (see above); it was left in place for inspection" >&2
    exit 1
fi
echo "built $DIST/Hearth in $((SECONDS - started)) s: $(du -sh "$DIST/Hearth" | cut -f1)"
