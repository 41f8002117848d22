"""The package version (one place; `stabledrl_trl.__version__` and the model card read it)."""

__version__ = "0.1.0"
