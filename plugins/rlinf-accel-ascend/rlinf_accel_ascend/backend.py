"""The `ascend` backend: Huawei Ascend NPUs. Shared logic lives in :mod:`rlinf_cli.accel`."""

from __future__ import annotations

from rlinf_cli.api import TorchBackend

class Ascend(TorchBackend):
    """Huawei Ascend NPUs through ``torch_npu``, which installs ``torch.npu`` when imported
    (it needs Huawei's CANN toolkit and driver on the machine)."""

    name = "ascend"
    namespace = "npu"
    device_type = "npu"
    extension = "torch_npu"
    dist = "hccl"
    visible_devices_env = ("ASCEND_RT_VISIBLE_DEVICES",)
    deepspeed_accelerator = "npu"
    package = "rlinf-accel-ascend"
    install_runtime = "pip install 'rlinf-accel-ascend[npu]'"

    def _why_no_runtime(self) -> str:
        return "torch_npu is not installed or cannot load (it needs Huawei's CANN toolkit)"
