#!/usr/bin/env bash
# Build the native llama-server from the pinned llama.cpp source into a cache keyed
# by the pin, and print the SLM_LLAMA_SERVER_BIN= line for .env.
#
#   scripts/build_llama.sh            build (a no-op when the binary is cached)
#   scripts/build_llama.sh --print    print the binary path the pin maps to, build nothing
#
# Source: a git checkout of the pinned commit when the git remote answers, otherwise
# the llama.cpp tree vendored in the pinned llama-cpp-python sdist from PyPI.
# CPU build on Linux, Metal on macOS. Works with macOS's bash 3.2.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
pin_file="$root/config/llama.cpp.pin"

pin_value() {
  sed -n "s/^$1=//p" "$pin_file" | head -n 1
}

commit=$(pin_value commit)
sdist_version=$(pin_value llama_cpp_python)
if [ -z "$commit" ] || [ -z "$sdist_version" ]; then
  echo "build_llama: $pin_file must set commit= and llama_cpp_python=" >&2
  exit 1
fi

jobs=$( (command -v nproc >/dev/null && nproc) || sysctl -n hw.ncpu 2>/dev/null || echo 2)
flags="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF"
flags="$flags -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF"
flags="$flags -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF"
cflags=""
case "$(uname -s)-$(uname -m)" in
  Darwin-*) flags="$flags -DGGML_METAL=ON" ;;
  # AMX tiles need a permission the kernel grants per process; virtual machines often
  # advertise AMX without granting it, and -march=native code then dies of SIGILL.
  Linux-x86_64) cflags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" ;;
esac

cache_root=${SLM_CACHE_DIR:-"$HOME/.cache/slm_server"}
recipe=$(printf '%s|%s' "$flags" "$cflags" | cksum | cut -d ' ' -f 1)
key="${commit:0:12}-$(uname -s)-$(uname -m)-$recipe"
prefix="$cache_root/llama.cpp/$key"
bin="$prefix/bin/llama-server"
git_url=${SLM_LLAMA_GIT_URL:-https://github.com/ggml-org/llama.cpp.git}

if [ "${1:-}" = "--print" ]; then
  echo "$bin"
  exit 0
fi

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "build_llama: llama-server for $key is already built" >&2
  echo "SLM_LLAMA_SERVER_BIN=$bin"
  exit 0
fi

for tool in cmake c++; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build_llama: '$tool' is required (install cmake and a C/C++ toolchain)" >&2
    exit 1
  fi
done

work="$cache_root/llama.cpp/build-$key.$$"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

src=""
# macOS has no timeout(1); there git's own low-speed limit bounds the probe instead.
limit=""
command -v timeout >/dev/null 2>&1 && limit="timeout 30"
if command -v git >/dev/null 2>&1 \
  && GIT_TERMINAL_PROMPT=0 $limit git -c http.lowSpeedLimit=1000 -c http.lowSpeedTime=20 \
    ls-remote "$git_url" HEAD >/dev/null 2>&1; then
  echo "build_llama: fetching llama.cpp $commit from git" >&2
  git init -q "$work/llama.cpp"
  if GIT_TERMINAL_PROMPT=0 git -C "$work/llama.cpp" fetch -q --depth 1 "$git_url" "$commit" \
    && git -C "$work/llama.cpp" checkout -q FETCH_HEAD; then
    src="$work/llama.cpp"
  fi
fi

if [ -z "$src" ]; then
  echo "build_llama: taking llama.cpp from the llama-cpp-python $sdist_version sdist (PyPI)" >&2
  sdist_dir="$cache_root/sdist"
  tarball="$sdist_dir/llama_cpp_python-$sdist_version.tar.gz"
  if [ ! -f "$tarball" ]; then
    mkdir -p "$sdist_dir"
    # shellcheck source=scripts/toolchain.sh
    . "$root/scripts/toolchain.sh"
    pip_cmd=$(find_pip)
    # shellcheck disable=SC2086  # pip_cmd is a word list on purpose
    $pip_cmd download --quiet --no-deps --no-binary :all: \
      "llama-cpp-python==$sdist_version" -d "$work/sdist" >&2
    mv "$work/sdist/llama_cpp_python-$sdist_version.tar.gz" "$tarball"
  fi
  tar -xzf "$tarball" -C "$work"
  src="$work/llama_cpp_python-$sdist_version/vendor/llama.cpp"
  vendored=$(sed -n 's/.*update llama.cpp to ggml-org\/llama.cpp@\([0-9a-f]*\).*/\1/p' \
    "$work/llama_cpp_python-$sdist_version/CHANGELOG.md" | head -n 1)
  case "$commit" in
    "$vendored"*) ;;
    *) echo "build_llama: warning: the sdist's changelog names llama.cpp@$vendored, the pin says $commit" >&2 ;;
  esac
fi

echo "build_llama: configuring ($src)" >&2
# shellcheck disable=SC2086  # flags is a word list on purpose
cmake -S "$src" -B "$work/build" $flags \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_CXX_FLAGS="$cflags" \
  -DLLAMA_BUILD_NUMBER=0 -DLLAMA_BUILD_COMMIT="${commit:0:12}" >&2
echo "build_llama: building llama-server with $jobs jobs (several minutes on 2 cores)" >&2
cmake --build "$work/build" --target llama-server -j "$jobs" >&2

mkdir -p "$prefix/bin"
cp "$work/build/bin/llama-server" "$bin.tmp"
mv "$bin.tmp" "$bin"
"$bin" --version >&2
echo "SLM_LLAMA_SERVER_BIN=$bin"
