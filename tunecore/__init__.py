"""tunecore: a tensor-program auto-tuner on Apache TVM with pluggable search, cost models, stores and measurers."""

from tunecore.hookspecs import hookimpl

__all__ = ["hookimpl"]
__version__ = "0.2.0"
