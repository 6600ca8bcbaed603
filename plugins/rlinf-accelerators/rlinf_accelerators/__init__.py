"""Accelerator backends. Importing this package does not import torch."""
