import os

# The tests run in two processes on two cores (README). OpenMP pools (torch, xgboost) of a core each then
# spin against the other process's work: under pytest-xdist the torch-training tests took 3-7x as long as
# alone. One thread each; tunecore's measurements are unaffected (they set TVM_NUM_THREADS, which TVM reads first).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The files whose tests took longest in a full two-process run (`--durations`, 2026-11-29, about 100-400 s each),
# handed out first: pytest-xdist gives each process the next file when it is nearly done, in collection order
# (once told not to reorder by test count), so long files started last left one process idle at the end.
LONGEST_FIRST = (
    "tests/test_dataset.py",
    "tests/test_layouts.py",
    "plugins/tlm_generator/tests/test_tlm_generator.py",
    "plugins/cdmpp_predictor/tests/test_cdmpp_predictor.py",
    "plugins/ansor_search/tests/test_ansor_search.py",
    "tests/test_cli.py",
    "tests/test_bench.py",
    "tests/test_shared_store.py",
    "plugins/cdmpp_predictor/tests/test_cdmpp_shipped_weights.py",
)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: within a file, and among the other files, the order stays
