"""The local executor: env instances on this machine."""
