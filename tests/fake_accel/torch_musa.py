"""Fake Moore Threads ``torch_musa``: importing it installs ``torch.musa``, as the real extension does."""

import os

import torch

from fake_runtime import FakeDeviceRuntime

torch.musa = FakeDeviceRuntime(int(os.environ.get("FAKE_DEVICES", "2")), "MTT-S4000-fake", bf16=False)
