"""A stand-in for a vendor's ``torch.<device>`` runtime (the API torch.cuda, torch_npu's torch.npu
and torch_musa's torch.musa share), so each accelerator plugin's logic runs on a CPU."""

from __future__ import annotations

from types import SimpleNamespace


class FakeDeviceRuntime:
    def __init__(self, count: int = 2, name: str = "FakeDevice", bf16: bool = True, total_gb: float = 64.0):
        self.count = count
        self.name = name
        self.bf16 = bf16
        self.total = int(total_gb * 2**30)
        self.current: int | None = None
        self.allocated = {i: (i + 1) * 2**30 for i in range(count)}

    def is_available(self) -> bool:
        return self.count > 0

    def device_count(self) -> int:
        return self.count

    def get_device_name(self, i: int = 0) -> str:
        return f"{self.name} #{i}"

    def set_device(self, i: int) -> None:
        if not 0 <= i < self.count:
            raise RuntimeError(f"invalid device ordinal {i}")
        self.current = i

    def current_device(self) -> int:
        return self.current or 0

    def is_bf16_supported(self) -> bool:
        return self.bf16

    def memory_allocated(self, i: int = 0) -> int:
        return self.allocated[i]

    def max_memory_allocated(self, i: int = 0) -> int:
        return 2 * self.allocated[i]

    def memory_reserved(self, i: int = 0) -> int:
        return 3 * self.allocated[i]

    def get_device_properties(self, i: int = 0) -> SimpleNamespace:
        return SimpleNamespace(total_memory=self.total, name=self.get_device_name(i))
