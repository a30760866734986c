#!/usr/bin/env bash
# A network built from a search round in the call that timed the round, on the GPU machine with TVM's compiler
# (bench/gpu_device.sh): the round's results (a timed `tunecore dataset export-batch --search ...` directory) go into
# a copy of the store the round was searched from, the network is built from each task's best record there
# (`bench/gpu.py network-export`, here) and timed against PyTorch eager (`network-time`). No trip back to the CPU
# machine between the round and the network; bench/gpu_batches.sh runs it after the round's batch (NETWORK_ROUND).
#
#   bash bench/gpu_round_network.sh BATCH STORE.db.xz MODEL NETWORK_DIR
set -euo pipefail
BATCH=${1:?the timed batch of a search round} STORE=${2:?the store it was searched from, xz}
MODEL=${3:?resnet-18 or mobilenet-v2} NET=${4:?the network directory to write}
mkdir -p "$NET"
xz -dc "$STORE" > "$NET/round.db"
rm -f "$NET/round.parquet"  # the round's rows alone: the store has the rest
python3 -m tunecore.cli dataset import-batch "$BATCH" --out "$NET/round.parquet"
python3 -m tunecore.cli dataset import "$NET/round.parquet" --store "sqlite:$NET/round.db"
TARGET=$(python3 -c "import sys; from tunecore.experiments import dataset_target; print(dataset_target(sys.argv[1]))" \
  "$NET/round.parquet")  # as the round's rows spell it: a task's id depends on it
python3 bench/gpu.py network-export --model "$MODEL" --target "$TARGET" --store "sqlite:$NET/round.db" --work "$NET" \
  --about "the records of $(basename "$STORE" .xz) and of the search round $(basename "$BATCH") timed in the same call, \
built on the GPU machine"
python3 bench/gpu.py network-time "$NET"
