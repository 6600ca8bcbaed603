"""rlinf: one command-line toolchain for RL on embodied and agentic AI."""

from rlinf_cli.determinism import configure_env as _configure_env

__version__ = "0.1.0"
# The core's name on the package index (`rlinf` there is another project); plugins depend on it.
DISTRIBUTION = "rlinf-cli"

# Before any torch op: MKL fixes its reproducibility mode at its first call (see determinism.py).
_configure_env()
