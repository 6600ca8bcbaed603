"""The `musa` backend: Moore Threads GPUs. Shared logic lives in :mod:`rlinf_cli.accel`."""

from __future__ import annotations

from rlinf_cli.api import TorchBackend

class MUSA(TorchBackend):
    """Moore Threads GPUs through ``torch_musa``, which installs ``torch.musa`` when imported.
    DeepSpeed has no MUSA accelerator (0.19): ``train.backend=deepspeed`` is not available here."""

    name = "musa"
    namespace = "musa"
    device_type = "musa"
    extension = "torch_musa"
    dist = "mccl"
    visible_devices_env = ("MUSA_VISIBLE_DEVICES",)
    deepspeed_accelerator = None
    package = "rlinf-accel-musa"
    install_runtime = "pip install 'rlinf-accel-musa[musa]'"

    def _why_no_runtime(self) -> str:
        return "torch_musa is not installed or cannot load (Moore Threads publishes it outside PyPI)"
