#!/usr/bin/env bash
# Short GPU benchmarks: GPT-2 small bf16 training, jaxformer (cuDNN flash attention, and
# tokamax's kernels when installed) vs torch_ref + torch.compile, with MFU; then greedy decoding
# with fp32 / bf16 / int8 weights (bench/generate.py), the step loop's host overhead and sharded
# init's host memory; about 10 minutes in all. Run it whenever a GPU machine is available:
#
#   On the dev machine, once: fetch CUDA wheels into .whl/ (ignored by git), e.g.
#     echo /.whl/ >> .git/info/exclude
#     python3 -m pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_27_x86_64 \
#         -d .whl "jax[cuda12]==0.10.2" flax optax orbax-checkpoint safetensors pyyaml tqdm tensorboardX tokamax
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
# the fused attention kernels side by side: cuDNN (the "auto" choice on NVIDIA GPUs) and
# tokamax where its wheel is present (add "tokamax" to the pip download above)
ATTN="cudnn"
python3 -c "import tokamax" 2>/dev/null && ATTN="cudnn tokamax"
timeout 200 python3 bench/gpu_train.py --batch 16 --seq 1024 --steps 20 --warmup 5 --attention $ATTN \
  --json "${OUT:-/tmp}/gpu_bench.json"
# greedy decoding with fp32 / bf16 / int8 weights (jaxformer on the GPU, HF's model on the host
# CPU as the weights' source and reference; needs transformers on that machine)
if timeout 150 python3 bench/generate.py --weights-dtype fp32 bf16 int8 --batches 1 8 --new 64 --repeats 2 \
    --skip torch_ref > "${OUT:-/tmp}/gpu_generate.log" 2>&1; then
  tail -n 1 "${OUT:-/tmp}/gpu_generate.log" > "${OUT:-/tmp}/gpu_generate.json"
else
  echo "bench/generate.py failed; see ${OUT:-/tmp}/gpu_generate.log"
fi
tail -n 12 "${OUT:-/tmp}/gpu_generate.log"
# the train loop's host overhead per step on the GPU (lm config, log_every 1 and 50)
if timeout 90 python3 bench/step_overhead.py > "${OUT:-/tmp}/gpu_step_overhead.log" 2>&1; then
  tail -n 1 "${OUT:-/tmp}/gpu_step_overhead.log" > "${OUT:-/tmp}/gpu_step_overhead.json"
fi
tail -n 5 "${OUT:-/tmp}/gpu_step_overhead.log"
# sharded init's host memory (8 host CPU devices, fsdp=8; the GPU machine's 128 GB fit it alone)
if timeout 140 python3 bench/init_memory.py > "${OUT:-/tmp}/init_memory.log" 2>&1; then
  tail -n 1 "${OUT:-/tmp}/init_memory.log" > "${OUT:-/tmp}/init_memory.json"
fi
tail -n 5 "${OUT:-/tmp}/init_memory.log"
