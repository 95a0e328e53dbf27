#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama.cpp source vendored in the llama-cpp-python sdist on PyPI
# (the only way to get it here: no prebuilt binaries can be downloaded). Built for this CPU (-march=native)
# but without AMX: on these VMs the CPU reports AMX and the first tile instruction dies with SIGILL. About 17 CPU-minutes, so the
# result is cached per sdist version; prints the path of the binary.
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
cache="${LLAMA_SERVER_CACHE:-$HOME/.cache/llm-serving-bench/llama-server-$version-noamx}"
if [ -x "$cache/bin/llama-server" ]; then echo "$cache/bin/llama-server"; exit 0; fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work" >&2
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
generator=(); command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$work/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF \
  -DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" \
  -DCMAKE_BUILD_RPATH='$ORIGIN' >&2  # the cached binary finds its .so files beside it
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$cache/bin"
cp "$work/build/bin/llama-server" "$cache/bin/"
find "$work/build" -name '*.so*' -exec cp -P {} "$cache/bin/" \;
echo "$cache/bin/llama-server"
