"""Fake Huawei ``torch_npu``: importing it installs ``torch.npu``, as the real extension does."""

import os

import torch

from fake_runtime import FakeDeviceRuntime

torch.npu = FakeDeviceRuntime(int(os.environ.get("FAKE_DEVICES", "2")), "Ascend910B-fake")
