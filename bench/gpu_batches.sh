#!/usr/bin/env bash
# One device call that times and profiles batches built on the CPU machine, on a GPU machine with TVM's runtime alone
# (docs/gpu.md, "Without TVM's compiler"): no compiler part travels, so the whole call goes to the GPU.
#
#   OUT=... bash bench/gpu_batches.sh SECONDS DIR
#
# DIR holds what was carried: the apache-tvm-ffi wheel, tvm-runtime.tar.xz and dist-info.tar (bench/gpu_carry.sh),
# batch archives b-*.tar.xz (`tunecore dataset export-batch` directories, xz) and network directories net-*.tar.xz
# (`python bench/gpu.py network-export`). In order, until SECONDS have passed: a smoke test (the first programs of
# the first batch: the call stops there if none runs), the networks against PyTorch eager, the batches timed in the
# order carried, then the batch NCU_BATCH names (its name as packed, e.g. bert2; default the first) profiled by ncu
# in the NCU_SECONDS (default 60) the timing leaves. Every step resumes where it stopped; $OUT gets results.tar.xz
# (every batch's results, profiles, ncu output and calls; the networks' reports; the logs), never the libraries.
#
# With OPS_SECONDS set and TVM's compiler installed (its parts carried by this or an earlier call to the same
# machine: bench/gpu_device.sh), the searches of `bench/gpu.py ops` come first, before the smoke test: one process
# per operator side by side for OPS_SECONDS less 90 s, each one's searches in turn (OPS_TRIALS each, default 64;
# a run the deadline cuts is left out), then each operator's best programs re-measured with the GPU otherwise
# idle; $OUT gets ops.tar.gz (each operator's ops.json, runs.json, the runs' stores and MetaSchedule's databases).
#
# With NETWORK_ROUND set (a batch's name as packed, e.g. r18-ansor1-p512: a search round) and TVM's compiler
# installed, that batch's network (NETWORK_MODEL, default resnet-18) is built here right after the batch is timed,
# from the carried store (DIR/*.db.xz, the one the round was searched from) and the round's results, and timed
# against PyTorch eager (bench/gpu_round_network.sh; its report comes back in results.tar.xz).
set -uo pipefail
START=$SECONDS
LIMIT=${1:?seconds}
CARRIED=${2:?the carried directory}
W=${GS_WORK:-/tmp/gs}
left() { echo $((LIMIT - (SECONDS - START))); }
pack() {
  (cd "$W" && find . -maxdepth 2 \( -name '*.json' -o -name '*.csv' -o -name '*.log' \) ! -name manifest.json \
    ! -name network.json | tar -cJf "$OUT/results.tar.xz" -T -)
  echo "packed: $(du -b "$OUT/results.tar.xz" | cut -f1) bytes; $(($(date +%s) - T0)) s"
}
T0=$(date +%s)
mkdir -p .whl .gpu "$W"
cp "$CARRIED"/*.whl .whl/ && cp "$CARRIED"/tvm-runtime.tar.xz "$CARRIED"/dist-info.tar .gpu/
source bench/gpu_device.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm --format=csv,noheader | tee "$W/gpu.log"
{ nvidia-smi | sed -n 3p; nvcc --version | tail -1; ncu --version | tail -1; python3 --version; nproc; } >> "$W/gpu.log"
for archive in "$CARRIED"/b-*.tar.xz "$CARRIED"/net-*.tar.xz; do
  [ -f "$archive" ] && [ ! -d "$W/$(basename "$archive" .tar.xz)" ] && tar -xJf "$archive" -C "$W" &
done
wait
cat "$W/gpu.log"

OPS="matmul-1024 conv2d-resnet50-c2 dense-bert"
METHODS=ansor+xgb,metaschedule,tlm  # in this order within an operator: a deadline cuts the last
COMPILER=/tmp/tunecore/site/tvm/lib/libtvm_compiler.so  # installed by bench/gpu_device.sh once all parts are in
if [ "${OPS_SECONDS:-0}" -gt 0 ] && [ -f "$COMPILER" ]; then
  OPS_END=$((SECONDS + OPS_SECONDS))
  pids=""
  for op in $OPS; do  # each its own process group, stopped whole at the deadline
    setsid python3 bench/gpu.py ops --phase runs --ops $op --methods $METHODS --trials "${OPS_TRIALS:-64}" \
      --work "$W/w-$op" > "$W/ops-$op.log" 2>&1 &
    pids="$pids $!"
  done
  while [ -n "$(jobs -r)" ] && [ $SECONDS -lt $((OPS_END - 90)) ]; do sleep 2; done
  for pid in $pids; do kill -9 -- -"$pid" 2>/dev/null; done
  wait
  n=3
  for op in $OPS; do  # each operator a share of what is left
    share=$(((OPS_END - SECONDS) / n)); n=$((n - 1))
    timeout $((share > 5 ? share : 5)) python3 bench/gpu.py ops --phase remeasure --ops $op --methods $METHODS \
      --trials "${OPS_TRIALS:-64}" --work "$W/w-$op" >> "$W/ops-$op.log" 2>&1
    tail -n 5 "$W/ops-$op.log"
  done
  (cd "$W" && tar -czf "$OUT/ops.tar.gz" w-* ops-*.log)
  echo "ops: $(du -b "$OUT/ops.tar.gz" | cut -f1) bytes; $(($(date +%s) - T0)) s"
elif [ "${OPS_SECONDS:-0}" -gt 0 ]; then
  echo "ops: skipped, TVM's compiler is not installed"
fi
BATCHES=$(ls -d "$W"/b-* 2>/dev/null)
FIRST=$(echo "$BATCHES" | head -n 1)
TIME="python3 -m tunecore.measure.batch"

# smoke: a few programs of the first batch; a call in which nothing runs ends here, with the reason
$TIME "$FIRST" --limit-s 1 2>&1 | tail -n 2 | tee -a "$W/time-smoke.log"
python3 - "$FIRST" <<'EOF' || { pack; exit 1; }
import collections, json, sys
results = json.load(open(sys.argv[1] + "/results.json"))["results"]
errors = collections.Counter(str(r["error"])[:200] for r in results.values())
print("smoke:", len(results), "timed:", dict(errors))
sys.exit(0 if any(r["error"] is None for r in results.values()) else 1)
EOF

for net in "$W"/net-*; do
  [ -d "$net" ] && timeout 180 python3 bench/gpu.py network-time "$net" > "$net.log" 2>&1 && tail -n 30 "$net.log"
done

NCU=${NCU_SECONDS:-60}  # kept for Nsight Compute at the end
for batch in $BATCHES; do  # every batch timed, in the order carried
  limit=$(($(left) - NCU - 20))
  [ "$limit" -gt 5 ] || break
  $TIME "$batch" --limit-s "$limit" > "$W/time-$(basename "$batch").log" 2>&1
  tail -n 2 "$W/time-$(basename "$batch").log"
  if [ -n "${NETWORK_ROUND:-}" ] && [[ $batch == *-"$NETWORK_ROUND" ]] && [ -f "$COMPILER" ]; then
    limit=$(($(left) - NCU - 20))  # the search round's network, built here and timed against PyTorch eager
    net="$W/net-$(basename "$batch")"
    if [ "$limit" -gt 60 ]; then
      timeout "$limit" bash bench/gpu_round_network.sh "$batch" "$CARRIED"/*.db.xz "${NETWORK_MODEL:-resnet-18}" \
        "$net" > "$net.log" 2>&1
      tail -n 30 "$net.log"
    else echo "network of $(basename "$batch"): $limit s left, not built"; fi
  fi
done
PROFILED=$(ls -d "$W"/b-*-"${NCU_BATCH:-}"* 2>/dev/null | head -n 1)  # NCU_BATCH: its name as packed, e.g. bert2
if [ "$NCU" -gt 0 ] && [ -n "$PROFILED" ] && [ "$(left)" -gt 25 ]; then
  timeout $(($(left) - 15)) python3 -m tunecore.cli ncu profile-batch "$PROFILED" --chunk 16 \
    > "$W/ncu-$(basename "$PROFILED").log" 2>&1
  # a cut leaves ncu's target process behind (timeout stops only its own child): nothing may run beside the timing
  pkill -f -- "--call-once" ; pkill -x ncu ; sleep 1
  tail -n 3 "$W/ncu-$(basename "$PROFILED").log"
fi
pack
