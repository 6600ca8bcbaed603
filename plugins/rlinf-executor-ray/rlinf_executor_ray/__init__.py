"""The Ray executor: env workers as Ray actors (this package imports Ray only when used)."""
