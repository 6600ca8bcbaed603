"""MLP actor-critic policies for rlinf. Importing this package does not import torch."""
