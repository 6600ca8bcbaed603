"""LIBERO manipulation suites as an rlinf simulator (see sim.py)."""
