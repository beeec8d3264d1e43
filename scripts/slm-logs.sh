#!/usr/bin/env bash
# Show the gateway's logs: a thin wrapper around `python -m slm_server logs`.
# Works with macOS's bash 3.2 and BSD tools as well as on Linux.
set -u

usage() {
  cat <<'EOF'
usage: scripts/slm-logs.sh [watchdog|all|raw] [-f]

  (no mode)   the server output: logs/start.out, as start.sh wrote it
  watchdog    the watchdog's events (logs/watchdog.jsonl) as a readable timeline
  all         both, merged in time order; watchdog lines are marked [watchdog]
  raw         start.out and then watchdog.jsonl, unformatted
  -f          keep printing new lines as they are written (Ctrl-C to stop)
  -h          this help

Paths come from the settings (SLM_BACKEND_LOG_DIR, SLM_WATCHDOG_LOG_PATH, .env).
Colour on a terminal unless NO_COLOR is set.
EOF
}

mode=""
follow=""
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help)
      usage
      exit 0
      ;;
    -f | --follow) follow="--follow" ;;
    server | watchdog | all | raw)
      if [ -n "$mode" ] && [ "$mode" != "$1" ]; then
        printf 'slm-logs.sh: choose one mode, not both %s and %s\n' "$mode" "$1" >&2
        exit 2
      fi
      mode=$1
      ;;
    *)
      printf 'slm-logs.sh: unknown argument: %s\n' "$1" >&2
      usage >&2
      exit 2
      ;;
  esac
  shift
done

root=$(cd "$(dirname "$0")/.." && pwd)
set -- -m slm_server logs "${mode:-server}"
if [ -n "$follow" ]; then
  set -- "$@" "$follow"
fi

# exec: Ctrl-C and SIGTERM reach Python directly, which stops following cleanly.
if [ -x "$root/.venv/bin/python" ]; then
  exec "$root/.venv/bin/python" "$@"
fi
if command -v uv >/dev/null 2>&1; then
  exec uv run --quiet --frozen --project "$root" python "$@"
fi
printf 'slm-logs.sh: no %s and no uv; run scripts/setup.sh first\n' "$root/.venv" >&2
exit 1
