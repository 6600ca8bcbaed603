"""Accelerator backends. Each says honestly what it detected: a backend is available only when
its runtime is importable and reports at least one device."""

from __future__ import annotations

import importlib
from typing import Any

import torch


class CPU:
    name = "cpu"

    def is_available(self) -> bool:
        return True

    def device(self) -> torch.device:
        return torch.device("cpu")

    def dist_backend(self) -> str:
        return "gloo"

    def supports_bf16(self) -> bool:
        return True

    def memory_stats(self) -> dict[str, float]:
        import resource

        return {"rss_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}

    def describe(self) -> str:
        return f"CPU, {torch.get_num_threads()} torch threads"


class CUDA:
    name = "cuda"

    def is_available(self) -> bool:
        return torch.cuda.is_available() and torch.version.hip is None

    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())

    def dist_backend(self) -> str:
        return "nccl"

    def supports_bf16(self) -> bool:
        return torch.cuda.is_bf16_supported()

    def memory_stats(self) -> dict[str, float]:
        return {"gpu_mem_peak_gb": torch.cuda.max_memory_allocated() / 2**30}

    def describe(self) -> str:
        if not self.is_available():
            return f"not available (torch {torch.__version__}, cuda build: {torch.version.cuda or 'no'})"
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})"


class ROCm(CUDA):
    name = "rocm"

    def is_available(self) -> bool:
        return torch.version.hip is not None and torch.cuda.is_available()

    def describe(self) -> str:
        if not self.is_available():
            return f"not available (torch {torch.__version__} is {'a ROCm' if torch.version.hip else 'not a ROCm'} build)"
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} (HIP {torch.version.hip})"


class _Vendor:
    """A vendor backend that plugs into torch through its own extension module."""

    name = ""
    module = ""
    attr = ""
    backend = ""

    def _runtime(self) -> Any | None:
        try:
            importlib.import_module(self.module)
        except Exception:
            return None
        return getattr(torch, self.attr, None)

    def is_available(self) -> bool:
        rt = self._runtime()
        return bool(rt is not None and rt.is_available() and rt.device_count() > 0)

    def device(self) -> torch.device:
        return torch.device(self.attr, 0)

    def dist_backend(self) -> str:
        return self.backend

    def supports_bf16(self) -> bool:
        return self.is_available()

    def memory_stats(self) -> dict[str, float]:
        rt = self._runtime()
        return {"device_mem_peak_gb": rt.max_memory_allocated() / 2**30} if rt is not None else {}

    def describe(self) -> str:
        rt = self._runtime()
        if rt is None:
            return f"not available ({self.module} is not installed)"
        return f"{rt.device_count()} device(s)" if self.is_available() else f"{self.module} imported but no device found"


class Ascend(_Vendor):
    name, module, attr, backend = "ascend", "torch_npu", "npu", "hccl"


class MUSA(_Vendor):
    name, module, attr, backend = "musa", "torch_musa", "musa", "mccl"
