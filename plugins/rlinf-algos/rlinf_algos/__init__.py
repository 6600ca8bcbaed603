"""rlinf's bundled algorithms. Importing this package does not import torch."""
