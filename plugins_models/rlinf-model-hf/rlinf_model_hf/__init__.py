"""transformers causal LMs as rlinf policies. Importing this package does not import torch."""
