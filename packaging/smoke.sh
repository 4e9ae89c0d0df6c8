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
# 2. The real window, on X11 (Qt's xcb platform plugin) under Xvfb through `xvfb-run`, the same way
#    otherwise: it must map (xwininfo finds a viewable top-level window named "Hearth") within
#    WINDOW_TIMEOUT seconds (default 90), stay up 10 s more without a traceback, and is then closed.
#    Needs xvfb-run and xwininfo: `apt-get install -y xvfb x11-utils` (Debian/Ubuntu).
# 3. `Hearth serve` (the headless server) the same way, offline: a chat request constrained by a JSON schema must
#    finish with "stop" and a reply naming the key "capital" (grammar-constrained output runs in the bundle).
#    Needs curl.
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

# The window: Xvfb, Qt's xcb plugin (no fallback to offscreen), the same offline, empty environment.
for tool in xvfb-run xwininfo; do
    if ! command -v $tool >/dev/null; then
        echo "smoke: FAIL ($tool not found; install it with: sudo apt-get install -y xvfb x11-utils)" >&2
        exit 1
    fi
done
window_env=("${clean_env[@]}" QT_QPA_PLATFORM=xcb)
t0=$SECONDS
status=0
# Runs inside xvfb-run, which sets DISPLAY and XAUTHORITY; $1 is the timeout, the rest the command that opens the window.
# Exit status: 0 mapped and stayed up, 2 never mapped, 3 exited early.
check_window='
    timeout=$1; shift
    "$@" DISPLAY="$DISPLAY" XAUTHORITY="${XAUTHORITY:-}" "$exe" &
    app=$!
    for ((i = 0; i < timeout; i++)); do
        kill -0 $app 2>/dev/null || { wait $app; echo "smoke: the app exited with status $?"; exit 3; }
        for id in $(xwininfo -root -tree | awk "/\"[^\"]*Hearth[^\"]*\":/ {print \$1}"); do
            if xwininfo -id "$id" | grep -q "Map State: IsViewable"; then
                echo "smoke: window $id mapped after $i s: $(xwininfo -id "$id" | grep -E "xwininfo:|Width|Height" | tr -s " \n" " ")"
                sleep 10
                kill -0 $app 2>/dev/null || { wait $app; echo "smoke: the app exited after mapping"; exit 3; }
                kill -TERM $app
                wait $app || true
                exit 0
            fi
        done
        sleep 1
    done
    kill -TERM $app; wait $app || true
    exit 2
'
exe=$exe xvfb-run --auto-servernum --server-args="-screen 0 1600x1000x24" \
    bash -c "$check_window" check_window "${WINDOW_TIMEOUT:-90}" "${offline[@]}" "${window_env[@]}" \
    >"$out" 2>&1 || status=$?
if [[ $status != 0 ]] || grep -q "Traceback" "$out"; then
    cat "$out" >&2
    case $status in
        2) why="no window named Hearth mapped within ${WINDOW_TIMEOUT:-90} s" ;;
        3) why="the app exited while its window should be open" ;;
        *) why="exit status $status, or a traceback" ;;
    esac
    echo "smoke: FAIL (the window under Xvfb: $why)" >&2
    exit 1
fi
grep "smoke: window" "$out"
echo "smoke: window opened on X11 (Xvfb), stayed up and was closed; $((SECONDS - t0)) s"

# The server, with a reply constrained by a JSON schema: llguidance (and its package metadata) work in the bundle.
if ! command -v curl >/dev/null; then
    echo "smoke: FAIL (curl not found; install it with: sudo apt-get install -y curl)" >&2
    exit 1
fi
port=${SMOKE_PORT:-48371}
body='{"model": "default", "max_tokens": 40, "temperature": 0,
  "messages": [{"role": "user", "content": "Give the capital of France as JSON."}],
  "response_format": {"type": "json_schema", "json_schema": {"name": "capital", "schema": {"type": "object",
    "properties": {"capital": {"type": "string"}}, "required": ["capital"]}}}}'
# Runs in the offline namespace (its loopback brought up, where it is a new one); $1 the port, $2 the body, the rest
# the command that starts the server. Prints the reply; exit 3 when the server never came up.
check_server='
    port=$1; body=$2; shift 2
    ip link set lo up 2>/dev/null || true
    "$@" &
    server=$!
    for ((i = 0; i < 120; i++)); do
        curl -sf -m 2 "http://127.0.0.1:$port/v1/models" >/dev/null && break
        kill -0 $server 2>/dev/null || { echo "the server exited"; exit 3; }
        sleep 1
    done
    curl -s -m 120 "http://127.0.0.1:$port/v1/chat/completions" -H "content-type: application/json" -d "$body"
    kill -TERM $server; wait $server || true
'
t0=$SECONDS
status=0
"${offline[@]}" bash -c "$check_server" check_server "$port" "$body" "${clean_env[@]}" "$exe" serve \
    --host 127.0.0.1 --port "$port" >"$out" 2>&1 || status=$?
reply=$(grep -o '"content":"[^"]*\(\\"[^"]*\)*"' "$out" | head -n 1 || true)
if [[ $status != 0 ]] || ! grep -q '"finish_reason":"stop"' "$out" || [[ $reply != *capital* ]]; then
    cat "$out" >&2
    echo "smoke: FAIL (the server's JSON-schema reply; status $status)" >&2
    exit 1
fi
echo "smoke: server answered a JSON-schema request offline in $((SECONDS - t0)) s: $reply"
echo "smoke: PASS in $((SECONDS - started)) s"
