#!/usr/bin/env bash
# Smoke test of the bundle dist/Hearth/: can it answer a prompt offline, on a fresh machine?
#
#   packaging/smoke.sh              # builds the bundle first if dist/Hearth/Hearth is missing
#   REBUILD=1 packaging/smoke.sh    # always rebuild
#   BUNDLE=/path/to/Hearth packaging/smoke.sh
#
# 1. `Hearth --self-test "What is the capital of France?"` must exit 0 and print a reply containing
#    "Paris". It runs offscreen, with no network (a new network namespace through `unshare -n`, or
#    `unshare -rn` without root; failing both, proxies pointed at a closed port plus HF_HUB_OFFLINE=1),
#    a fresh empty data dir, an empty environment and a PATH without a C compiler.
# 2. The window starts offscreen the same way and is still running 20 s later (Qt plugins, pyqtgraph).
set -euo pipefail

cd "$(dirname "$0")/.."
BUNDLE=${BUNDLE:-dist/Hearth}
PROMPT="What is the capital of France?"
started=$SECONDS

if [[ ${REBUILD:-0} == 1 || ! -x $BUNDLE/Hearth ]]; then
    packaging/build.sh
fi
exe=$(cd "$BUNDLE" && pwd)/Hearth

data=$(mktemp -d)
out=$(mktemp)
trap 'rm -rf "$data" "$out"' EXIT
# Nothing from the caller's environment: no venv, no PYTHONPATH, no compiler on PATH.
clean_env=(env -i HOME="$data" PATH=/nonexistent LANG=C.UTF-8 HEARTH_DATA_DIR="$data" QT_QPA_PLATFORM=offscreen)

if unshare -n true 2>/dev/null; then
    offline=(unshare -n)
    how="unshare -n"
elif unshare -rn true 2>/dev/null; then
    offline=(unshare -rn)
    how="unshare -rn"
else
    dead=http://127.0.0.1:9  # the discard port: connections are refused
    offline=(env http_proxy=$dead https_proxy=$dead HTTP_PROXY=$dead HTTPS_PROXY=$dead ALL_PROXY=$dead
        all_proxy=$dead no_proxy= NO_PROXY= HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1)
    how="proxies blocked (no network namespace available)"
fi
echo "smoke: $exe, offline via $how, data dir $data"

t0=$SECONDS
status=0
"${offline[@]}" "${clean_env[@]}" "$exe" --self-test "$PROMPT" >"$out" || status=$?
echo "smoke: self-test exited $status after $((SECONDS - t0)) s; reply: $(cat "$out")"
if [[ $status != 0 ]]; then
    echo "smoke: FAIL (self-test exit status $status)" >&2
    exit 1
fi
if ! grep -q "Paris" "$out"; then
    echo "smoke: FAIL (the reply does not mention Paris)" >&2
    exit 1
fi
if [[ -n $(ls -A "$data") ]]; then
    echo "smoke: note: the self-test wrote to the data dir: $(ls -A "$data")"
fi

t0=$SECONDS
status=0
timeout 20 "${offline[@]}" "${clean_env[@]}" "$exe" >"$out" 2>&1 || status=$?
if [[ $status != 124 ]] || grep -q "Traceback" "$out"; then
    cat "$out" >&2
    echo "smoke: FAIL (the window did not keep running: exit status $status)" >&2
    exit 1
fi
echo "smoke: window ran for $((SECONDS - t0)) s without errors"
echo "smoke: PASS in $((SECONDS - started)) s"
