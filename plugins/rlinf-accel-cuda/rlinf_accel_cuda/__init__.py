"""rlinf accelerator backend `cuda`. Importing this package does not import torch."""
