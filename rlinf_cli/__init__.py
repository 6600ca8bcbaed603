"""rlinf: one command-line toolchain for RL on embodied and agentic AI."""

__version__ = "0.1.0"
