#!/usr/bin/env bash
# Makes, from this checkout's .venv, what bench/gpu_device.sh installs on the lent GPU machine (Python 3.12, no
# package registry, no TVM): run it here once (about a minute on 2 cores: xz of TVM's 259 MB compiler library), then carry
# the paths it prints with the device calls (each call takes at most 64 MiB; the compiler's parts may come in the
# next calls to the same warm machine). Idempotent: what exists is kept; `rm -r .whl .gpu` to make it again.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mkdir -p .whl .gpu
# wheels for the device's Python: tvm-ffi (a compiled extension per Python version) and what tunecore needs that
# the device lacks
if ! ls .whl/apache_tvm_ffi-*cp312*.whl > /dev/null 2>&1; then
  XGBOOST=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('xgboost-cpu'))")
  .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
    apache-tvm-ffi==0.1.14.post0 "xgboost-cpu==$XGBOOST"  # (psutil and cloudpickle: the image has them)
fi
# TVM's package without its compiler library: TVM's runtime alone (enough for python -m tunecore.measure.batch)
# (each file is written under another name and renamed when whole: a stopped run leaves nothing that looks done)
[ -f .gpu/tvm-runtime.tar.xz ] || { tar -C "$SITE" --exclude tvm/lib/libtvm_compiler.so --exclude __pycache__ \
  -cJf .gpu/tvm-runtime.tar.xz.part tvm && mv .gpu/tvm-runtime.tar.xz.part .gpu/tvm-runtime.tar.xz; }
# the compiler library, xz with the x86 filter at its strongest (57.8 MB of 259 MB, 3.4 min on one core; -6: 62 MB),
# in parts of at most PART_MIB (default 47: a first call with bench/gpu_tree.sh's slim tree, the wheels and the
# runtime stays under 64 MiB; the second part, 8 MB, leaves the next call room for batches)
if [ ! -f .gpu/compiler.xz.count ]; then
  rm -f .gpu/compiler.xz.[0-9]*
  xz --x86 --lzma2=preset=9e,dict=192MiB -c "$SITE/tvm/lib/libtvm_compiler.so" \
    | split -b "${PART_MIB:-47}M" -d -a 1 - .gpu/compiler.xz.
  ls .gpu/compiler.xz.[0-9]* | wc -l > .gpu/compiler.xz.count.part && mv .gpu/compiler.xz.count.part .gpu/compiler.xz.count
fi
# tunecore's and its plugins' entry points
[ -f .gpu/dist-info.tar ] || { tar -C "$SITE" -cf .gpu/dist-info.tar.part $(cd "$SITE" && ls -d tunecore*.dist-info) \
  && mv .gpu/dist-info.tar.part .gpu/dist-info.tar; }
du -b .whl .gpu/* | sort -k2
echo "carry in the first call: [\".whl\", \".gpu/tvm-runtime.tar.xz\", \".gpu/dist-info.tar\", \".gpu/compiler.xz.count\", \".gpu/compiler.xz.0\"]"
for part in $(ls .gpu/compiler.xz.[0-9]* | tail -n +2); do echo "carry in a next call: [\"$part\"]"; done
