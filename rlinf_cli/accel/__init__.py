"""Accelerator backends: the shared logic every vendor package builds on, and the built-in CPU.

A vendor package (``rlinf-accel-cuda``, ``-rocm``, ``-ascend``, ``-musa``) subclasses
:class:`TorchBackend` with a handful of class attributes (which torch namespace, which
extension module, which collective library, which environment variables) and registers it.
Everything a stage needs from an accelerator is implemented once, here:

- device selection: ``device()`` maps this process's ``LOCAL_RANK`` (torchrun) onto the
  visible devices, ``set_device()`` makes it current before a process group starts;
- the distributed backend (``nccl``; ROCm's rccl answers to ``nccl``; ``hccl``; ``mccl``);
- bf16 support and memory queries (allocated / reserved / peak / total, in GiB);
- the environment each vendor reads (``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``,
  ``ASCEND_RT_VISIBLE_DEVICES``, ``MUSA_VISIBLE_DEVICES``) and DeepSpeed's accelerator name;
- what ``rlinf doctor`` shows: detected devices, what was verified on real hardware (read from
  the package's ``verified.json``, shipped in its wheel), and the command that installs what is
  missing.

Importing this module does not import torch: registration must stay fast.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from rlinf_cli import DISTRIBUTION

GIB = float(2**30)


@dataclass(frozen=True)
class Verification:
    """One run on real hardware, as recorded in a package's ``verified.json``."""

    date: str
    hardware: str
    software: str = ""
    checks: str = ""

    def line(self) -> str:
        parts = [self.date, self.hardware] + [p for p in (self.software, self.checks) if p]
        return ", ".join(parts)


@dataclass(frozen=True)
class HardwareRecord:
    """A package's ``verified.json``: what its backend was run on, and when."""

    backend: str
    verified: tuple[Verification, ...] = ()
    unverified: str = ""  # why nothing is recorded yet (shown by `rlinf doctor`)
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        if not self.verified:
            return "never on real hardware" + (f" ({self.unverified})" if self.unverified else "")
        last = self.verified[-1]
        more = f" (+{len(self.verified) - 1} earlier)" if len(self.verified) > 1 else ""
        return last.line() + more


def read_hardware_record(package: str) -> HardwareRecord | None:
    """The ``verified.json`` shipped in the importable package ``package`` (None if it has none).

    A damaged file is reported as such rather than trusted: an accelerator's claims must be
    machine-checkable, never prose.
    """
    from importlib import resources

    try:
        text = resources.files(package).joinpath("verified.json").read_text()
    except (FileNotFoundError, ModuleNotFoundError, NotADirectoryError):
        return None
    try:
        data = json.loads(text)
        runs = tuple(Verification(str(r["date"]), str(r["hardware"]), str(r.get("software", "")), str(r.get("checks", "")))
                     for r in data.get("verified", []))
        return HardwareRecord(str(data["backend"]), runs, str(data.get("unverified", "")),
                              {k: v for k, v in data.items() if k not in ("backend", "verified", "unverified")})
    except (ValueError, KeyError, TypeError) as exc:
        return HardwareRecord("?", (), f"verified.json is damaged: {type(exc).__name__}: {exc}")


def local_rank() -> int:
    """This process's rank on its machine (torchrun/deepspeed set ``LOCAL_RANK``); 0 alone."""
    try:
        return max(0, int(os.environ.get("LOCAL_RANK", "0")))
    except ValueError:
        return 0


class TorchBackend:
    """A device family reached through a ``torch.<namespace>`` runtime (``torch.cuda``, ``torch.npu``...).

    Subclasses set the class attributes; ``_runtime_ok`` may add a check (a CUDA build is not
    a ROCm build). The runtime is looked up on each call, so tests can put a fake vendor module
    in place and see the backend's logic run on a CPU.
    """

    name = ""
    namespace = ""  # torch.<namespace> is the device runtime
    device_type = ""  # torch.device type string
    extension: str | None = None  # vendor module that installs torch.<namespace> when imported
    dist = ""  # torch.distributed backend
    visible_devices_env: tuple[str, ...] = ()  # variables that restrict the visible devices (first is set)
    deepspeed_accelerator: str | None = None  # DeepSpeed's name for this accelerator (DS_ACCELERATOR)
    package = ""  # the distribution that ships this backend (for messages)
    install_runtime = ""  # the command that installs the vendor runtime when it is missing

    # -- the vendor runtime ------------------------------------------------------------------
    def runtime(self) -> Any | None:
        """``torch.<namespace>`` once its extension is imported, or None when it cannot be."""
        import torch

        if self.extension:
            try:
                importlib.import_module(self.extension)
            except Exception:  # ImportError, or a vendor library that fails to load its driver
                return None
        rt = getattr(torch, self.namespace, None)
        return rt if rt is not None and self._runtime_ok() else None

    def _runtime_ok(self) -> bool:
        return True

    def missing(self) -> str | None:
        """What stops this backend here, as one short phrase; None when it is usable."""
        rt = self.runtime()
        if rt is None:
            return self._why_no_runtime()
        try:
            if not rt.is_available() or rt.device_count() < 1:
                return "runtime present, no device detected"
        except Exception as exc:  # a driver error is "not detected", not a crash
            return f"runtime error: {type(exc).__name__}: {exc}"
        return None

    def _why_no_runtime(self) -> str:
        return f"{self.extension} is not installed" if self.extension else f"torch has no {self.namespace} runtime"

    def is_available(self) -> bool:
        return self.missing() is None

    def device_count(self) -> int:
        return int(self.runtime().device_count()) if self.is_available() else 0

    def device_names(self) -> list[str]:
        rt = self.runtime()
        return [str(rt.get_device_name(i)) for i in range(self.device_count())]

    # -- device selection ----------------------------------------------------------------------
    def device_index(self, rank: int | None = None) -> int:
        """``LOCAL_RANK`` (or ``rank``) mapped onto the visible devices: rank r uses device r mod n."""
        r = local_rank() if rank is None else int(rank)
        n = self.device_count()
        return r % n if n else 0

    def device(self, rank: int | None = None) -> Any:
        import torch

        return torch.device(self.device_type, self.device_index(rank))

    def set_device(self, rank: int | None = None) -> None:
        """Make this process's device current (before ``init_process_group``: nccl/hccl bind to it)."""
        self.runtime().set_device(self.device_index(rank))

    def dist_backend(self) -> str:
        return self.dist

    def supports_bf16(self) -> bool:
        if not self.is_available():
            return False
        check = getattr(self.runtime(), "is_bf16_supported", None)
        return bool(check()) if check is not None else True

    def memory_stats(self) -> dict[str, float]:
        """Allocated, reserved (cached by the allocator), peak allocated and total memory of this
        process's device, in GiB. Empty when the backend is not usable."""
        if not self.is_available():
            return {}
        rt, i = self.runtime(), self.device_index()
        out = {"mem_allocated_gb": rt.memory_allocated(i) / GIB, "mem_peak_gb": rt.max_memory_allocated(i) / GIB}
        reserved = getattr(rt, "memory_reserved", None)
        if reserved is not None:
            out["mem_reserved_gb"] = reserved(i) / GIB
        props = getattr(rt, "get_device_properties", None)
        if props is not None:
            out["mem_total_gb"] = float(props(i).total_memory) / GIB
        return out

    # -- launching ---------------------------------------------------------------------------------
    def launch_env(self, devices: list[int] | None = None) -> dict[str, str]:
        """Environment for processes that should use ``devices`` (all visible when None), with
        DeepSpeed told which accelerator to load."""
        env: dict[str, str] = {}
        if devices is not None and self.visible_devices_env:
            env[self.visible_devices_env[0]] = ",".join(str(int(d)) for d in devices)
        if self.deepspeed_accelerator:
            env["DS_ACCELERATOR"] = self.deepspeed_accelerator
        return env

    def prepare_deepspeed(self) -> None:
        """Before ``import deepspeed``: name the accelerator (its auto-detection probes CUDA first)."""
        if self.deepspeed_accelerator:
            os.environ.setdefault("DS_ACCELERATOR", self.deepspeed_accelerator)

    # -- reporting ---------------------------------------------------------------------------------
    def visible_devices(self) -> str | None:
        for var in self.visible_devices_env:
            if var in os.environ:
                return f"{var}={os.environ[var]}"
        return None

    def describe(self) -> str:
        why = self.missing()
        if why is not None:
            return f"not detected ({why})"
        names = self.device_names()
        label = names[0] if len(set(names)) == 1 else ", ".join(names)
        vis = self.visible_devices()
        return f"{len(names)} x {label}" + (f" ({vis})" if vis else "")

    def install_hint(self) -> str | None:
        """The one command that would install what is missing (None when nothing is)."""
        return None if self.is_available() or self.runtime() is not None else (self.install_runtime or None)

    def hardware_record(self) -> HardwareRecord | None:
        return read_hardware_record(type(self).__module__.split(".")[0])


class CPU:
    """Always available; gloo for several processes. Built into rlinf."""

    name = "cpu"
    device_type = "cpu"
    dist = "gloo"
    visible_devices_env: tuple[str, ...] = ()
    deepspeed_accelerator = "cpu"
    package = DISTRIBUTION

    def is_available(self) -> bool:
        return True

    def missing(self) -> str | None:
        return None

    def device_count(self) -> int:
        return 1

    def device_names(self) -> list[str]:
        import platform

        return [platform.processor() or platform.machine()]

    def device_index(self, rank: int | None = None) -> int:
        return 0

    def device(self, rank: int | None = None) -> Any:
        import torch

        return torch.device("cpu")

    def set_device(self, rank: int | None = None) -> None:
        pass

    def dist_backend(self) -> str:
        return self.dist

    def supports_bf16(self) -> bool:
        return True

    def memory_stats(self) -> dict[str, float]:
        import resource

        return {"rss_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB}

    def launch_env(self, devices: list[int] | None = None) -> dict[str, str]:
        return {}

    def prepare_deepspeed(self) -> None:
        pass  # DeepSpeed's own detection falls back to its cpu accelerator when no device runtime is found

    def describe(self) -> str:
        import torch

        return f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads"

    def install_hint(self) -> str | None:
        return None

    def hardware_record(self) -> HardwareRecord | None:
        return read_hardware_record("rlinf_cli.accel")
