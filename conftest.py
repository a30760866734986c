import os

# The tests run in two processes on two cores (README). OpenMP pools (torch, xgboost) of a core each then
# spin against the other process's work: under pytest-xdist the torch-training tests took 3-7x as long as
# alone. One thread each; tunecore's measurements are unaffected (they set TVM_NUM_THREADS, which TVM reads first).
os.environ.setdefault("OMP_NUM_THREADS", "1")
