"""rlinf: one command-line toolchain for RL on embodied and agentic AI."""

from rlinf_cli.determinism import configure_env as _configure_env

__version__ = "0.1.0"

# Before any torch op: MKL fixes its reproducibility mode at its first call (see determinism.py).
_configure_env()
