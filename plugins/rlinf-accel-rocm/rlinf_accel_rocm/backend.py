"""The `rocm` backend: AMD GPUs. Shared logic lives in :mod:`rlinf_cli.accel`."""

from __future__ import annotations

from rlinf_cli.api import TorchBackend

class ROCm(TorchBackend):
    """AMD GPUs through a ROCm (HIP) build of torch. HIP keeps CUDA's Python API: the runtime is
    ``torch.cuda``, devices are ``cuda:N``, and ``nccl`` is served by RCCL. DeepSpeed reaches
    ROCm through its ``cuda`` accelerator."""

    name = "rocm"
    namespace = "cuda"
    device_type = "cuda"
    dist = "nccl"
    # HIP_VISIBLE_DEVICES is what HIP applications read; ROCR_ restricts at the driver level and
    # CUDA_VISIBLE_DEVICES is honoured by ROCm builds of torch as well
    visible_devices_env = ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    deepspeed_accelerator = "cuda"
    package = "rlinf-accel-rocm"
    install_runtime = "pip install --force-reinstall torch --index-url https://download.pytorch.org/whl/rocm6.4"

    def _runtime_ok(self) -> bool:
        import torch

        return torch.version.hip is not None

    def _why_no_runtime(self) -> str:
        import torch

        return f"torch {torch.__version__} is not a ROCm build"

    def describe(self) -> str:
        import torch

        text = super().describe()
        return text if self.missing() else f"{text}, HIP {torch.version.hip}"
