"""rlinf accelerator backend `musa`. Importing this package does not import torch."""
