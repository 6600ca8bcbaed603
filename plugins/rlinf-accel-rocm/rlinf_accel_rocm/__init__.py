"""rlinf accelerator backend `rocm`. Importing this package does not import torch."""
