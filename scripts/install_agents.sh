#!/usr/bin/env bash
# Install the coding agents of config/agents.pin (Claude Code, Codex CLI, opencode) from
# npm into a cache keyed by the pinned versions, and print the SLM_AGENTS_BIN= line the
# tests read (tests/integration/test_launch_real.py).
#
#   scripts/install_agents.sh           install (a no-op when the cache has them)
#   scripts/install_agents.sh --print   print the bin directory the pins map to, install nothing
#
# Everything goes into ~/.cache/slm_server/agents/<key>/ (or $SLM_CACHE_DIR), never into
# the checkout, npm's global prefix or the system; npm keeps its downloads in its own
# cache (~/.npm). Needs node and npm. Works with macOS's bash 3.2.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
pin_file="$root/config/agents.pin"
programs="claude codex opencode"

specs=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$pin_file")
if [ -z "$specs" ]; then
  echo "install_agents: $pin_file names no package" >&2
  exit 1
fi

cache_root=${SLM_CACHE_DIR:-"$HOME/.cache/slm_server"}
sum=$(printf '%s\n' "$specs" | cksum | cut -d ' ' -f 1)
key="$sum-$(uname -s)-$(uname -m)"
prefix="$cache_root/agents/$key"
bin="$prefix/node_modules/.bin"

if [ "${1:-}" = "--print" ]; then
  echo "$bin"
  exit 0
fi

installed() {
  local program
  for program in $programs; do
    [ -x "$bin/$program" ] || return 1
  done
}

if installed; then
  echo "install_agents: the agents of $key are already installed" >&2
  echo "SLM_AGENTS_BIN=$bin"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "install_agents: npm is required (install Node.js 20 or later)" >&2
  exit 1
fi

# Installed beside the cache entry and moved into place whole: an interrupted install
# never looks like a finished one.
work="$cache_root/agents/install-$key.$$"
rm -rf "$work"
mkdir -p "$work/home"
trap 'rm -rf "$work"' EXIT
echo "install_agents: installing $(printf '%s' "$specs" | tr '\n' ' ') into $prefix" >&2
# shellcheck disable=SC2086  # specs is a word list on purpose
npm install --prefix "$work" --no-audit --no-fund --loglevel=error --prefer-offline $specs >&2
for program in $programs; do
  # A home of its own: Codex makes ~/.codex even to print its version.
  if ! HOME="$work/home" "$work/node_modules/.bin/$program" --version >/dev/null 2>&1; then
    echo "install_agents: $program does not run after the install" >&2
    exit 1
  fi
done
rm -rf "${work:?}/home" "${prefix:?}"
mv "$work" "$prefix"
trap - EXIT
echo "SLM_AGENTS_BIN=$bin"
