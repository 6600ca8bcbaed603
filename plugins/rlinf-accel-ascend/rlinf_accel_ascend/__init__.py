"""rlinf accelerator backend `ascend`. Importing this package does not import torch."""
