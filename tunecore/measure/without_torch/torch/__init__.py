"""Stands in for torch in the processes a tunecore process starts (``keep_torch_out`` in
tunecore.measure.local puts this folder first on their PYTHONPATH).

TVM's popen workers, which would import torch through TVM's FFI for nothing (seconds each), get an
ImportError, which TVM expects; any other process gets the real torch, loaded in this module's place.
"""

import importlib
import os
import sys

if "tvm.exec.popen_worker" in getattr(sys, "orig_argv", ()):
    raise ImportError("torch is kept out of tunecore's measurement workers")

_folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _folder]
del sys.modules[__name__]
# the import system hands out whatever sys.modules holds under this name once this file has run
sys.modules[__name__] = importlib.import_module(__name__)
