#!/usr/bin/env bash
# Run the gateway from a fresh clone: install what is missing, start the model
# backends, wait for them, start the router on http://127.0.0.1:8000, and stop
# everything on Ctrl-C. The whole run is teed to logs/start.out (rotated past 10 MB).
# Works with macOS's bash 3.2 and BSD tools as well as on Linux.
set -u

root=$(cd "$(dirname "$0")" && pwd)
cd "$root" || exit 1
env_file=${SLM_ENV_FILE:-$root/.env}
log_dir=${SLM_BACKEND_LOG_DIR:-}
if [ -z "$log_dir" ] && [ -f "$env_file" ]; then
  # The same precedence as the gateway's own settings: environment first, then .env.
  log_dir=$(sed -n 's/^[[:space:]]*\(export[[:space:]]*\)\{0,1\}SLM_BACKEND_LOG_DIR=//p' "$env_file" \
    | tail -n 1 | sed "s/^[\"']//; s/[\"']\$//")
fi
log_dir=${log_dir:-logs}
mkdir -p "$log_dir"

out=$log_dir/start.out
if [ -f "$out" ] && [ "$(wc -c < "$out" | tr -d ' ')" -gt 10485760 ]; then
  mv "$out" "$out.1"
fi
# tee ignores Ctrl-C so the shutdown messages still reach the file.
exec > >(trap '' INT TERM; tee -a "$out") 2>&1

say() { printf '[start] %s\n' "$*"; }
say "$(date '+%Y-%m-%d %H:%M:%S') starting slm_server in $root"

if ! bash scripts/setup.sh; then
  say "setup failed; see the messages above"
  exit 1
fi

py="$root/.venv/bin/python"
# The settings as the gateway resolves them (.env, with the environment winning).
if ! settings=$("$py" -m slm_server settings router_host router_port ready_timeout_seconds); then
  say "could not read the settings; see the message above"
  exit 1
fi
# shellcheck disable=SC2086  # three words on purpose
set -- $settings
router_host=$1
router_port=$2
ready_timeout=$3

if ! "$py" -m slm_server check; then
  say "the registry has problems (above): starting what can start"
fi

backends_pid=""
router_pid=""
stopping=false
# shellcheck disable=SC2329  # invoked from the traps below
cleanup() {
  [ "$stopping" = true ] && return
  stopping=true
  say "stopping"
  [ -n "$router_pid" ] && kill -TERM "$router_pid" 2>/dev/null
  [ -n "$backends_pid" ] && kill -TERM "$backends_pid" 2>/dev/null
  [ -n "$router_pid" ] && wait "$router_pid" 2>/dev/null
  [ -n "$backends_pid" ] && wait "$backends_pid" 2>/dev/null
  say "stopped"
}
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
trap cleanup EXIT
# SIGHUP reloads the registry (docs/operations.md#reloading-the-registry); it no
# longer stops anything.
# shellcheck disable=SC2329  # invoked from the trap below
reload() {
  say "reloading the registry"
  [ -n "$backends_pid" ] && kill -HUP "$backends_pid" 2>/dev/null
}
trap reload HUP

"$py" -m slm_server backends &
backends_pid=$!
say "backends launcher started (pid $backends_pid); loading models"

# Follows the launcher's published states; a backend counts as ready only when its
# /health answered 200 and its process (and the launcher) are alive.
if ! "$py" -m slm_server status --wait "$ready_timeout" --launcher "$backends_pid"; then
  say "no backend could start; see the messages above and logs/"
  exit 1
fi

"$py" -m slm_server router &
router_pid=$!
url="http://$router_host:$router_port"
tries=0
until "$py" -c "import sys, httpx; sys.exit(httpx.get('$url/health', timeout=1).status_code != 200)" 2>/dev/null; do
  if ! kill -0 "$router_pid" 2>/dev/null; then
    say "the router exited; see the messages above"
    exit 1
  fi
  tries=$((tries + 1))
  if [ "$tries" -gt 120 ]; then
    say "the router did not answer on $url within 60s"
    exit 1
  fi
  sleep 0.5
done

"$py" - "$url" <<'PY'
import sys

import httpx

for model in httpx.get(sys.argv[1] + "/v1/models", timeout=5).json()["data"]:
    print(f"[start]   model {model['id']} ({model['model_type']}, {model['backend']})")
PY
say "try: curl $url/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\": \"smollm2-135m-instruct\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'"
say "ready: $url/v1 (OpenAI-compatible)"
say "press Ctrl-C to stop"

while kill -0 "$backends_pid" 2>/dev/null && kill -0 "$router_pid" 2>/dev/null; do
  sleep 1
done
if ! kill -0 "$backends_pid" 2>/dev/null; then
  say "the backends launcher exited; stopping the router"
else
  say "the router exited; stopping the backends"
fi
exit 1
