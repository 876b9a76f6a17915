#!/usr/bin/env bash
# The README's test command: install what the tests need, then run them on every core.
#   tests/run.sh [PYTEST ARGS]            into the Python on PATH
#   VENV=DIR tests/run.sh [PYTEST ARGS]   into a fresh virtual environment made at DIR (as CI does)
set -euo pipefail
cd "$(dirname "$0")/.."
# llama-cpp-python (the tests' OpenAI-compatible server) builds llama.cpp from source. Only the text library is
# needed: the multimodal one, llama.cpp's tests, tools, examples and server binary are skipped. Built for AVX2
# rather than -march=native: on a CPU with AMX the native build's AMX path crashed the server (SIGSEGV) on
# SmolLM2's Q4_1 weights at the first completion.
export CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF"
export CMAKE_ARGS="$CMAKE_ARGS -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
python=python3
if [ -n "${VENV:-}" ]; then
    python3 -m venv "$VENV"
    python="$VENV/bin/python"
fi
# No wheel cache: pip does not key a cached llama-cpp-python wheel on CMAKE_ARGS, and a native build crashes as said.
"$python" -m pip install --quiet --no-cache-dir torch==2.13.0 -e '.[test]'
exec "$python" -m pytest -q -n auto --dist loadgroup "$@"
