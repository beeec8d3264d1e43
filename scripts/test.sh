#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs and builds what the tests need
# (scripts/setup.sh --for-tests), runs the static checks, then pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k router -x).
#
#   scripts/test.sh --fast [pytest args]   the Python environment, ruff, and the unit
#                                          and in-process tests (tests/unit) alone:
#                                          no llama-server, models or browser needed
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

# shellcheck source=scripts/toolchain.sh
. "$root/scripts/toolchain.sh"

if [ "${1:-}" = "--fast" ]; then
  shift
  bash scripts/setup.sh --env-only
  uv_cmd=$(find_uv)
  echo "[test] ruff"
  "$uv_cmd" run --frozen ruff check .
  "$uv_cmd" run --frozen ruff format --check .
  # The unit tests compute rather than wait: one worker per CPU.
  cpus=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
  workers=${SLM_TEST_WORKERS:-$cpus}
  echo "[test] pytest (fast: tests/unit, $workers workers)"
  exec "$uv_cmd" run --frozen pytest tests/unit -n "$workers" --dist loadgroup "$@"
fi

bin_line=$(bash scripts/setup.sh --for-tests | tail -n 1)
export SLM_LLAMA_SERVER_BIN=${bin_line#SLM_LLAMA_SERVER_BIN=}
# The coding agents `launch` starts in its real test (config/agents.pin), from npm into
# ~/.cache/slm_server/agents. Without them that test fails (it never skips); the rest runs.
if agents_line=$(bash scripts/install_agents.sh | tail -n 1); then
  export SLM_AGENTS_BIN=${agents_line#SLM_AGENTS_BIN=}
else
  echo "[test] the coding agents could not be installed: test_launch_real.py will fail" >&2
fi

uv_cmd=$(find_uv)
run() { "$uv_cmd" run --frozen "$@"; }

echo "[test] ruff"
run ruff check .
run ruff format --check .
echo "[test] mypy (strict)"
run mypy
echo "[test] shellcheck"
run shellcheck start.sh scripts/*.sh .ci/run
# Most tests wait on real processes rather than compute, so twice as many workers as
# CPUs (at most 8) keeps the machine busy; SLM_TEST_WORKERS overrides. Tests marked
# `serial` (their outcome depends on timing under a busy CPU) run alone afterwards.
cpus=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
workers=$((cpus * 2 > 8 ? 8 : cpus * 2))
workers=${SLM_TEST_WORKERS:-$((workers < 2 ? 2 : workers))}
echo "[test] pytest ($workers workers)"
parallel=0
run pytest -n "$workers" --dist loadgroup -m "not serial" "$@" || parallel=$?
echo "[test] pytest (serial tests, alone)"
serial=0
run pytest -m serial "$@" || serial=$?
# Both parts always run; 5 means a part collected nothing (a selection without any
# serial test, or with only serial tests).
for status in "$parallel" "$serial"; do
  [ "$status" -eq 0 ] || [ "$status" -eq 5 ] || exit "$status"
done
if [ "$parallel" -eq 5 ] && [ "$serial" -eq 5 ]; then
  echo "[test] no test was selected"
  exit 5
fi
