# shellcheck shell=bash
# Sourced by setup.sh, test.sh and build_llama.sh: finds (or installs) uv, and a pip.
#
# `python3` may be a virtual environment without pip or uv (inside `uv run`, the
# project's .venv is first on PATH), and uv may never have been installed. So uv is
# looked for on PATH, then in the cache, and otherwise installed into the cache
# (~/.cache/slm_server/uv/<version>, keyed by the pinned version) with the pip of the
# base interpreter behind whatever `python3` is. Nothing goes into ~/.local or the system.
# Runs on macOS's bash 3.2 and Linux.

SLM_UV_VERSION=${SLM_UV_VERSION:-0.13.9}

# The interpreter a venv's python3 was made from (python3 itself when it is no venv).
base_python() {
  local base
  base=$(python3 -c 'import sys; print(sys.base_prefix)' 2>/dev/null) || base=""
  if [ -n "$base" ] && [ -x "$base/bin/python3" ]; then
    printf '%s\n' "$base/bin/python3"
  else
    command -v python3
  fi
}

# Prints a pip command line: python3's pip, else the base interpreter's, else uv's.
find_pip() {
  local base
  if python3 -m pip --version >/dev/null 2>&1; then
    printf '%s\n' "python3 -m pip"
    return 0
  fi
  base=$(base_python)
  if "$base" -m pip --version >/dev/null 2>&1; then
    printf '%s\n' "$base -m pip"
    return 0
  fi
  printf '%s\n' "$(find_uv) tool run pip"
}

# Prints the path of a uv executable, installing the pinned release into the cache
# when there is none; the install's messages go to stderr.
find_uv() {
  local cached dir base tmp
  if command -v uv >/dev/null 2>&1; then
    command -v uv
    return 0
  fi
  dir="${SLM_CACHE_DIR:-$HOME/.cache/slm_server}/uv/$SLM_UV_VERSION"
  cached="$dir/bin/uv"
  if [ -x "$cached" ]; then
    printf '%s\n' "$cached"
    return 0
  fi
  printf '[setup] installing uv %s from PyPI into %s\n' "$SLM_UV_VERSION" "$dir" >&2
  base=$(base_python)
  mkdir -p "$(dirname "$dir")"
  tmp=$(mktemp -d "$dir.tmp.XXXXXX")
  # --target leaves the interpreter's own packages alone (and so is allowed where a
  # system Python is marked externally managed, PEP 668). Without a pip there, a
  # throwaway venv brings one (ensurepip).
  if ! "$base" -m pip install --quiet --disable-pip-version-check --target "$tmp" \
    "uv==$SLM_UV_VERSION" >&2; then
    rm -rf "$tmp"
    tmp=$(mktemp -d "$dir.tmp.XXXXXX")
    if ! { "$base" -m venv "$tmp/venv" >&2 \
      && "$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --target "$tmp/pkg" "uv==$SLM_UV_VERSION" >&2; }; then
      rm -rf "$tmp"
      printf '[setup] could not install uv: put uv on PATH, or install pip for %s\n' "$base" >&2
      return 1
    fi
    mv "$tmp/pkg"/* "$tmp/"
    rm -rf "$tmp/venv" "$tmp/pkg"
  fi
  if [ ! -x "$tmp/bin/uv" ]; then
    rm -rf "$tmp"
    printf '[setup] the uv %s package had no bin/uv\n' "$SLM_UV_VERSION" >&2
    return 1
  fi
  rm -rf "$dir"
  mv "$tmp" "$dir"
  printf '%s\n' "$cached"
}
