"""The `cuda` backend: NVIDIA GPUs. Shared logic lives in :mod:`rlinf_cli.accel`."""

from __future__ import annotations

from rlinf_cli.api import TorchBackend

class CUDA(TorchBackend):
    """NVIDIA GPUs through ``torch.cuda`` of a CUDA build of torch (a ROCm build answers to
    ``torch.cuda`` too: that is the ``rocm`` backend's)."""

    name = "cuda"
    namespace = "cuda"
    device_type = "cuda"
    dist = "nccl"
    visible_devices_env = ("CUDA_VISIBLE_DEVICES",)
    deepspeed_accelerator = "cuda"
    package = "rlinf-accel-cuda"
    install_runtime = "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/cu128"

    def _runtime_ok(self) -> bool:
        import torch

        return torch.version.cuda is not None and torch.version.hip is None

    def _why_no_runtime(self) -> str:
        import torch

        kind = "a ROCm" if torch.version.hip else "a CPU-only"
        return f"torch {torch.__version__} is {kind} build"

    def describe(self) -> str:
        import torch

        text = super().describe()
        return text if self.missing() else f"{text}, CUDA {torch.version.cuda}"
