"""rlinf text tasks with verifiable rewards. Importing this package does not import torch."""
