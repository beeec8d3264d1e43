#!/usr/bin/env bash
# Install and build what slm_server needs, each step skipped when already done:
# uv, the Python environment (uv.lock), the pinned native llama-server (cached under
# ~/.cache/slm_server), the default models (models/), .env and config/models.yaml.
#
#   scripts/setup.sh              everything, for running the gateway
#   scripts/setup.sh --for-tests  the same without creating .env or config/models.yaml,
#                                 and on Linux Debian's chromium and chromium-driver for
#                                 the dashboard's browser test (apt-get, as root or sudo)
#   scripts/setup.sh --env-only   the Python environment alone, as for the tests (what
#                                 the unit tests need: scripts/test.sh --fast)
#
# Prints SLM_LLAMA_SERVER_BIN=... as its last line. Runs on macOS's bash 3.2 and Linux.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
for_tests=false
env_only=false
case "${1:-}" in
  --for-tests) for_tests=true ;;
  --env-only) for_tests=true; env_only=true ;;
esac

say() { printf '[setup] %s\n' "$*" >&2; }

# shellcheck source=scripts/toolchain.sh
. "$root/scripts/toolchain.sh"
uv_cmd=$(find_uv)

say "syncing the Python environment (uv.lock)"
# MLX backends: always on Apple Silicon (SLM_SKIP_MLX=1 to leave them out); on Linux
# (MLX on the CPU) for the test suite, or when SLM_WITH_MLX=1.
extras=""
cpu_torch=false
case "$(uname -s)-$(uname -m)" in
  Darwin-arm64)
    [ "${SLM_SKIP_MLX:-}" != "1" ] && extras="--extra mlx" ;;
  Linux-*)
    if [ "$for_tests" = true ] || [ "${SLM_WITH_MLX:-}" = "1" ]; then
      extras="--extra mlx"
      cpu_torch=true
    fi ;;
esac
# shellcheck disable=SC2086  # extras is a word list on purpose
# --inexact keeps what the user (or the CPU torch step below) added by hand.
"$uv_cmd" sync --frozen --inexact $extras >&2
if [ "$env_only" = true ]; then
  exit 0
fi

# PyPI's Linux torch is a CUDA build of several GB; mlx-openai-server needs torch only
# for CPU-side helpers (outlines, mlx-whisper), so Linux gets the CPU build, fetched once
# with pip's own configuration (or from SLM_TORCH_INDEX_URL) and cached as a wheel.
if [ "$cpu_torch" = true ] && ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  torch_version=${SLM_TORCH_VERSION:-2.13.0}
  wheels="${SLM_CACHE_DIR:-$HOME/.cache/slm_server}/wheels"
  mkdir -p "$wheels"
  pyver=$(.venv/bin/python -c 'import sys; print("%d%d" % sys.version_info[:2])')
  wheel=$(find "$wheels" -name "torch-${torch_version}+cpu-cp${pyver}-*.whl" | head -n 1)
  if [ -z "$wheel" ]; then
    say "fetching the CPU build of torch ${torch_version}"
    pip_cmd=$(find_pip)
    # shellcheck disable=SC2086  # pip_cmd is a word list on purpose
    $pip_cmd download --quiet --no-deps --only-binary=:all: \
      --python-version "$pyver" -d "$wheels" "torch==${torch_version}+cpu" >&2 \
      || $pip_cmd download --quiet --no-deps --only-binary=:all: \
        --python-version "$pyver" -d "$wheels" \
        --index-url "${SLM_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" \
        "torch==${torch_version}+cpu" >&2
    wheel=$(find "$wheels" -name "torch-${torch_version}+cpu-cp${pyver}-*.whl" | head -n 1)
  fi
  say "installing $(basename "$wheel")"
  # --no-config: the project's overrides keep torch out of the lock on Linux on purpose.
  "$uv_cmd" pip install --quiet --no-config --python .venv/bin/python "$wheel" >&2
fi

say "building the pinned llama-server (cached after the first run)"
bin_line=$(bash scripts/build_llama.sh | tail -n 1)
bin=${bin_line#SLM_LLAMA_SERVER_BIN=}

# The dashboard's browser test (tests/integration/test_dashboard.py) drives Debian's
# chromium through its chromedriver; SLM_CHROMIUM and SLM_CHROMEDRIVER name others.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  else
    sudo -n "$@"
  fi
}
if [ "$for_tests" = true ] && [ "$(uname -s)" = Linux ] \
  && { [ -z "${SLM_CHROMIUM:-}" ] || [ -z "${SLM_CHROMEDRIVER:-}" ]; } \
  && { [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; }; then
  if ! command -v apt-get >/dev/null 2>&1; then
    say "apt-get not found: install chromium and chromedriver, then set SLM_CHROMIUM and"
    say "SLM_CHROMEDRIVER to them (the dashboard's browser test needs both)"
    exit 1
  fi
  if [ "$(id -u)" -ne 0 ] && ! { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; }; then
    say "chromium and chromium-driver are missing and installing them needs root: run"
    say "  sudo apt-get install -y chromium chromium-driver"
    say "(or this script as root, or with password-less sudo), then run it again"
    exit 1
  fi
  say "installing chromium and chromium-driver with apt-get (the dashboard's browser test)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >&2
fi

say "fetching the default models into models/"
UV="$uv_cmd" "$uv_cmd" run --frozen python scripts/fetch_models.py >&2

if [ "$for_tests" = false ]; then
  env_file=${SLM_ENV_FILE:-"$root/.env"}
  if [ ! -f "$env_file" ]; then
    cp .env.example "$env_file"
    say "created $env_file from .env.example"
  fi
  if ! grep -q '^SLM_LLAMA_SERVER_BIN=' "$env_file"; then
    printf 'SLM_LLAMA_SERVER_BIN=%s\n' "$bin" >> "$env_file"
    say "set SLM_LLAMA_SERVER_BIN in $env_file"
  fi
  if [ -z "${SLM_CONFIG:-}" ] && [ ! -f config/models.yaml ]; then
    cp config/models.yaml.example config/models.yaml
    say "created config/models.yaml from config/models.yaml.example"
  fi
fi
echo "SLM_LLAMA_SERVER_BIN=$bin"
