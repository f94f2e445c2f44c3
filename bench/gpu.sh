#!/usr/bin/env bash
# One short GPU benchmark: GPT-2 small bf16 training, jaxformer (cuDNN flash attention) vs
# torch_ref + torch.compile, with MFU. Run it whenever a GPU machine is available:
#
#   On the dev machine, once: fetch CUDA wheels into .whl/ (ignored by git), e.g.
#     echo /.whl/ >> .git/info/exclude
#     python3 -m pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_27_x86_64 \
#         -d .whl "jax[cuda12]==0.10.2" flax optax orbax-checkpoint safetensors pyyaml tqdm tensorboardX
#   Then on the GPU machine (torch with CUDA is usually preinstalled there):
#     bash bench/gpu.sh            # writes $OUT/gpu_bench.json when OUT is set
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.85
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
timeout 500 python3 bench/gpu_train.py --batch 16 --seq 1024 --steps 20 --warmup 5 \
  --json "${OUT:-/tmp}/gpu_bench.json"
