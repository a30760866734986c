# Source on a GPU machine that has python3, numpy and the CUDA driver but no package registry and no TVM
# (the project's lent H100): installs what was carried into /tmp/tunecore and puts it on PYTHONPATH and PATH.
#
#   .whl/            apache-tvm-ffi (cp312) and xgboost-cpu wheels (pip download --python-version 3.12 ...)
#   .gpu/tvm-runtime.tar.xz   the tvm package without lib/libtvm_compiler.so: TVM's runtime alone
#   .gpu/dist-info.tar        tunecore's and its plugins' .dist-info (entry points), from `bash install.sh` here
#   .gpu/compiler.xz.N        parts of lib/libtvm_compiler.so, xz (one call carries at most 64 MiB: the parts may
#                             come in separate calls to the same machine; the compiler is installed once all are in)
#
# After it: `python3 -m tunecore.measure.batch DIR` works with the runtime alone; with the compiler, all of tunecore
# (`python3 -m tunecore.cli run --target cuda`, `... dataset collect --target cuda`).
T=/tmp/tunecore
mkdir -p $T/site $T/parts
# the code runs from this checkout (what the call sent); the installed copies give the entry points
export PYTHONPATH=$PWD:$(ls -d $PWD/plugins/*/ | tr "\n" ":")$T/site PATH=$T/site/bin:$PATH
if [ ! -f $T/site/tvm/__init__.py ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $T/site .whl/*.whl
  tar -xJf .gpu/tvm-runtime.tar.xz -C $T/site
fi
for part in .gpu/compiler.xz.*; do [ -f "$part" ] && cp "$part" $T/parts/; done
if [ ! -f $T/site/tvm/lib/libtvm_compiler.so ] && [ -f $T/parts/compiler.xz.count ] \
   && [ "$(ls $T/parts/compiler.xz.[0-9]* | wc -l)" = "$(cat $T/parts/compiler.xz.count)" ]; then
  cat $T/parts/compiler.xz.[0-9]* | xz -d > $T/site/tvm/lib/libtvm_compiler.so.part \
    && mv $T/site/tvm/lib/libtvm_compiler.so.part $T/site/tvm/lib/libtvm_compiler.so
fi
# tunecore's and its plugins' entry points (their dist-info from an install on the CPU machine)
[ -d $T/site/tunecore-0.2.0.dist-info ] || tar -xf .gpu/dist-info.tar -C $T/site
if [ -f $T/site/tvm/lib/libtvm_compiler.so ]; then echo "tunecore: TVM with its compiler"; else
  echo "tunecore: TVM's runtime only ($(ls $T/parts 2>/dev/null | tr '\n' ' '))"; fi
