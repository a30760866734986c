#!/usr/bin/env bash
# Makes here, before a lent GPU's calls, everything they carry (docs/gpu.md, "Next time a GPU is lent"): the wheels,
# TVM's runtime and its compiler in parts (bench/gpu_carry.sh), the batches of issue 39's open items, and the folder
# .gpu/up that bench/gpu_batches.sh reads there. About 40 min on 2 cores; run it in the background as soon as a GPU
# is lent (or before), nothing else heavy beside it:
#
#   mkdir -p .gpu && nohup bash bench/gpu_prepare.sh > .gpu/prepare.log 2>&1 &
#
# Resumable: a step that ended leaves .gpu/STEP.done and is skipped; one that was cut starts again from scratch.
# The batches are issue 39's open items as they stand: once a GPU session has timed and imported one, replace it here
# with what comes next (ResNet-18's next round from the grown store, BERT-base's next seed; b-again-ncu has nothing
# left to build once its timings are imported, and export-batch says so).
# Nothing tracked changes (tlm_gpu.py's reports go to .gpu/results); the tree is left whole (slim it just before
# the calls: bash bench/gpu_tree.sh slim).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
mkdir -p .gpu
step() {  # step NAME OUTPUT... -- COMMAND...: runs COMMAND unless NAME ended before; OUTPUTs are removed first
  local name=$1; shift
  local outputs=()
  while [ "$1" != "--" ]; do outputs+=("$1"); shift; done; shift
  if [ -f ".gpu/$name.done" ]; then echo "$(date +%T) $name: done before"; return; fi
  echo "$(date +%T) $name: $*"
  rm -rf "${outputs[@]}"
  "$@"
  touch ".gpu/$name.done"
}
bash bench/gpu_carry.sh
python -c "from tunecore.experiments import dataset_target; print(dataset_target('datasets/gpu-h100.parquet'), end='')" \
  > .gpu/h100.json
H100=$(cat .gpu/h100.json)
# BERT-base's matmuls, 128 random programs a task (seeds 0 and 1 are in the dataset): ncu's next 768 profiles
step b-bert2 .gpu/b-bert2 -- tunecore dataset export-batch --target "$H100" --model zoo:bert-base --kernels matmul \
  --per-task 128 --seed 2 --out .gpu/b-bert2
# the ncu study's held-out task again (its programs without a second label): the study's noise ceiling on every
# profiled program of it, not on the 23 that had one (bench/results/ncu-h100.md)
step b-again-ncu .gpu/b-again-ncu -- tunecore dataset export-batch --second-labels-of datasets/gpu-h100.parquet \
  --model zoo:bert-base --tasks fused_matmul4_add2_add3 --target "$H100" --per-task 256 --out .gpu/b-again-ncu
# tlm's weights learned from the GPU dataset (14 min)
step tlm-base .gpu/tlm-cuda-base-1500.pt -- tunecore tlm pretrain -d datasets/gpu-h100.parquet --from-dataset \
  --steps 1500 -o .gpu/tlm-cuda-base-1500.pt
step tlm-finetuned .gpu/tlm-cuda-1500.pt -- tunecore tlm finetune -d datasets/gpu-h100.parquet \
  --weights .gpu/tlm-cuda-base-1500.pt --top 4 -o .gpu/tlm-cuda-1500.pt
# ResNet-18's next round on the H100: ansor+xgb learned from the dataset's H100 rows, 16 programs a task (14 min)
step h100-store .gpu/h100.db -- tunecore dataset import datasets/gpu-h100.parquet --store sqlite:.gpu/h100.db
step b-r18-ansor1-p512 .gpu/b-r18-ansor1-p512 -- tunecore dataset export-batch --model zoo:resnet-18 \
  --target "$H100" --per-task 16 --search ansor --cost-model xgb -O search.population=512 \
  --store sqlite:.gpu/h100.db --out .gpu/b-r18-ansor1-p512
# tlm's own programs for the GPU, within its limits (the -nolimits batches beside them are not timed)
W=(--weights shipped=shipped --weights h100-1500=.gpu/tlm-cuda-1500.pt --out .gpu/results)
step tlm-ops .gpu/b-tlm_gpu-{shipped,h100-1500}{,-nolimits} -- python bench/tlm_gpu.py "${W[@]}"
step tlm-bert .gpu/b-tlm_gpu-bert-base-{shipped,h100-1500}{,-nolimits} -- python bench/tlm_gpu.py "${W[@]}" \
  --models zoo:bert-base --kernels matmul --name tlm_gpu-bert-base
# timed there in this order; ncu profiles the batch NCU_BATCH names (bert2); the store ResNet-18's round was searched
# from, for its network built there (NETWORK_ROUND)
step up .gpu/up -- bash bench/gpu_pack.sh .gpu/up b-r18-ansor1-p512 b-again-ncu b-tlm_gpu-shipped \
  b-tlm_gpu-h100-1500 b-tlm_gpu-bert-base-shipped b-tlm_gpu-bert-base-h100-1500 b-bert2 h100.db
echo "$(date +%T) ready: bash bench/gpu_tree.sh slim, then the two calls of docs/gpu.md"
