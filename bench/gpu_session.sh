#!/usr/bin/env bash
# One lent GPU session's work (the GPU issue) as a pipeline that runs in the background on the GPU machine, so that
# each device call (at most 10 minutes) only starts it, or waits and packs what it has made into $OUT. Run after
# `source bench/gpu_device.sh` with TVM's compiler installed (docs/gpu.md):
#
#   bash bench/gpu_session.sh start            # starts the pipeline (setsid), returns at once
#   bash bench/gpu_session.sh snap SECONDS     # waits up to SECONDS, or until the pipeline is done; packs into $OUT
#   bash bench/gpu_session.sh final SECONDS    # snap, then stops whatever still runs
#
# Two chains, their work in $GS_WORK (default /tmp/gs, kept while the machine stays warm):
# - builds (CPU, niced): random programs for `cuda` of BERT-base's matmul tasks (two seeds, 128 per task each: the
#   ncu study's 128-program groups), then of ResNet-18's and MobileNetV2's tasks, each batch in its own directory;
# - the GPU: the three operators of bench/gpu.py (ansor+xgb, tlm and MetaSchedule, 64 trials each) and ResNet-18
#   tuned, compiled and set against PyTorch eager, side by side; then the same commands once more with the GPU
#   otherwise idle (finished runs are kept: only the joint re-measurement of the best programs, the compile and
#   PyTorch's timing run again, on a quiet GPU); then the BERT batches timed (label protocol) and profiled by ncu;
#   then the CNN batches timed. The tuning runs share the GPU with each other, so their searches see noisier
#   timings than a run alone would: the reported latencies are the quiet re-measurements'.
#
# $OUT gets work.tar.gz (results and logs, no stores or libraries) and batches.tar.xz (every batch's manifest,
# results, profiles and ncu output, no libraries): back here, `tunecore dataset import-batch` each batch directory
# and `python bench/gpu.py report` the work directories.
set -uo pipefail
W=${GS_WORK:-/tmp/gs}
OPS="matmul-1024 conv2d-resnet50-c2 dense-bert"
TC="python3 -m tunecore.cli"

wait_for_batch() {  # until the batch's manifest is written, or the builds are over
  while [ ! -f "$W/$1/manifest.json" ] && [ ! -f "$W/builds.done" ]; do sleep 5; done
  [ -f "$W/$1/manifest.json" ]
}

gpu_chain() {
  for op in $OPS; do
    python3 bench/gpu.py ops --ops "$op" --methods ansor+xgb,tlm,metaschedule --trials 64 --work "$W/w-$op" \
      > "$W/ops-$op.log" 2>&1 &
  done
  python3 bench/gpu.py network --model resnet-18 --trials 200 --work "$W/w-net" > "$W/net.log" 2>&1 &
  wait
  for op in $OPS; do
    python3 bench/gpu.py ops --ops "$op" --methods ansor+xgb,tlm,metaschedule --trials 64 --work "$W/w-$op" \
      >> "$W/ops-$op.log" 2>&1
  done
  python3 bench/gpu.py network --model resnet-18 --trials 200 --work "$W/w-net" >> "$W/net.log" 2>&1
  for batch in b-bert0 b-bert1; do
    wait_for_batch $batch && python3 -m tunecore.measure.batch "$W/$batch" > "$W/time-$batch.log" 2>&1
  done
  for batch in b-bert0 b-bert1; do
    [ -f "$W/$batch/manifest.json" ] && $TC ncu profile-batch "$W/$batch" > "$W/ncu-$batch.log" 2>&1
  done
  for batch in b-resnet18 b-mobilenetv2; do
    wait_for_batch $batch && python3 -m tunecore.measure.batch "$W/$batch" > "$W/time-$batch.log" 2>&1
  done
  touch "$W/gpu.done"
}

build_chain() {
  $TC dataset export-batch --model zoo:bert-base --kernels matmul --target cuda --per-task 128 --seed 0 \
    --out "$W/b-bert0" > "$W/build-bert0.log" 2>&1 &
  $TC dataset export-batch --model zoo:bert-base --kernels matmul --target cuda --per-task 128 --seed 1 \
    --out "$W/b-bert1" > "$W/build-bert1.log" 2>&1 &
  wait
  $TC dataset export-batch --model zoo:resnet-18 --target cuda --per-task 128 --out "$W/b-resnet18" \
    > "$W/build-resnet18.log" 2>&1
  $TC dataset export-batch --model zoo:mobilenet-v2 --target cuda --per-task 128 --out "$W/b-mobilenetv2" \
    > "$W/build-mobilenetv2.log" 2>&1
  touch "$W/builds.done"
}

snap() {  # wait up to $1 seconds for the GPU chain, then pack what there is into $OUT
  local until=$((SECONDS + ${1:-0}))
  while [ ! -f "$W/gpu.done" ] && [ $SECONDS -lt "$until" ]; do sleep 5; done
  mkdir -p "${OUT:?OUT is where the device call takes files back from}"
  (cd "$W" && tar -czf "$OUT/work.tar.gz" --exclude='*.db*' --exclude='*.so' --exclude='*.tar' $(ls -d w-* *.log *.done 2>/dev/null))
  (cd "$W" && find b-* -maxdepth 2 \( -name '*.json' -o -name '*.csv' \) 2>/dev/null | tar -cJf "$OUT/batches.tar.xz" -T -)
  echo "gpu_session: $(ls "$W" | tr '\n' ' ')"
  tail -n 3 "$W"/*.log 2>/dev/null | tail -n 60
}

case "${1:-}" in
  start)
    if [ -f "$W/pids" ]; then echo "gpu_session: already started ($W)"; exit 0; fi
    mkdir -p "$W"
    export -f gpu_chain build_chain wait_for_batch
    export W OPS TC
    setsid nohup nice -n 10 bash -c build_chain > "$W/builds.log" 2>&1 < /dev/null &
    echo $! >> "$W/pids"
    setsid nohup bash -c gpu_chain > "$W/gpu.log" 2>&1 < /dev/null &
    echo $! >> "$W/pids"
    echo "gpu_session: started in $W";;
  snap) snap "${2:-0}";;
  final)
    snap "${2:-0}"
    for pid in $(cat "$W/pids" 2>/dev/null); do kill -- -"$pid" 2>/dev/null; done
    echo "gpu_session: stopped";;
  *) echo "usage: bash bench/gpu_session.sh start | snap SECONDS | final SECONDS" >&2; exit 2;;
esac
