#!/usr/bin/env bash
# Serve a GGUF model with the batched engine on this GPU machine, measure its throughput, stop it.
#
#   infra/gpu_engine.sh MODEL.gguf [OUT_DIR]
#
# The model got here in parts (see docs/engine.md): `python -m infra.models join PARTS_DIR MODEL.gguf`,
# once per arriving part, assembles and verifies it. This script then
#   1. installs the pure-Python `gguf` package from a carried wheel if it is missing ($GGUF_WHEEL, or
#      the first gguf-*.whl under ./wheels), since transformers reads GGUF files with it;
#   2. starts `python -m infra.engine` on 127.0.0.1:$PORT in the background and waits for /health;
#   3. runs benchmarks/engine_throughput.py ($REQUESTS requests, $CONCURRENCY at a time, $MAX_TOKENS
#      tokens each) and writes OUT_DIR/engine_throughput.json, OUT_DIR/engine.log, OUT_DIR/nvidia-smi.txt;
#   4. stops the engine, unless KEEP=1 (then it keeps serving for the generator or forecaster).
# Engine flags go in $ENGINE_ARGS (e.g. ENGINE_ARGS="--max-batch 128 --dtype float16").
set -euo pipefail

MODEL=${1:?usage: infra/gpu_engine.sh MODEL.gguf [OUT_DIR]}
OUT=${2:-engine-out}
PORT=${PORT:-8000}
REQUESTS=${REQUESTS:-256}
CONCURRENCY=${CONCURRENCY:-256}
MAX_TOKENS=${MAX_TOKENS:-400}
PYTHON=${PYTHON:-python}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"

[ -f "$MODEL" ] || { echo "no model file at $MODEL; join its parts first: python -m infra.models join PARTS_DIR $MODEL" >&2; exit 2; }
if ! "$PYTHON" -c "import gguf" 2>/dev/null; then
    wheel=${GGUF_WHEEL:-$(ls wheels/gguf-*.whl 2>/dev/null | head -1 || true)}
    [ -n "$wheel" ] || { echo "the gguf package is missing and no gguf-*.whl was carried (set GGUF_WHEEL)" >&2; exit 2; }
    "$PYTHON" -m pip install --quiet --no-deps --no-index "$wheel"
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

# shellcheck disable=SC2086
"$PYTHON" -m infra.engine --model "$MODEL" --host 127.0.0.1 --port "$PORT" ${ENGINE_ARGS:-} > "$OUT/engine.log" 2>&1 &
ENGINE=$!
stop() { if [ "${KEEP:-0}" != 1 ]; then kill "$ENGINE" 2>/dev/null || true; wait "$ENGINE" 2>/dev/null || true; fi; }
trap stop EXIT

for _ in $(seq 600); do
    if ! kill -0 "$ENGINE" 2>/dev/null; then echo "the engine exited:" >&2; tail -30 "$OUT/engine.log" >&2; exit 1; fi
    "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null && break
    sleep 1
done
tail -1 "$OUT/engine.log"

"$PYTHON" benchmarks/engine_throughput.py --url "http://127.0.0.1:$PORT/v1" --requests "$REQUESTS" \
    --concurrency "$CONCURRENCY" --max-tokens "$MAX_TOKENS" --json "$OUT/engine_throughput.json"
