"""The accelerator contract: a backend is what it claims to be.

Where the backend is usable here, its device has the declared type and computes, its bf16 claim
holds on that device, and a one-process group of its declared collective backend starts and
reports that name (cpu: gloo). Where it is not (a GPU backend on a CPU machine), the declared
names are checked without a device: a device type torch (or the declared extension) provides, a
collective backend name, the environment variables it sets, and no bf16 claim.
"""

from __future__ import annotations

import re
from typing import Any

from rlinf_cli.testing.plugins import spec_of
from rlinf_cli.testing.report import Check, Checks

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_ENV = re.compile(r"^[A-Z][A-Z0-9_]*$")


def accelerator_checks(name: str) -> list[Check]:
    checks = Checks()
    built: list[Any] = []

    def construct() -> str:
        built.append(spec_of("accelerator", name).load()())
        return type(built[0]).__name__

    if not checks.run("construction", construct):
        return checks.rows
    accel = built[0]
    available: list[bool] = []

    def describe() -> str:
        text = accel.describe()
        assert isinstance(text, str) and text, f"describe() returned {text!r}; expected a non-empty string"
        ok = accel.is_available()
        assert isinstance(ok, bool), f"is_available() returned {type(ok).__name__}; expected bool"
        if not ok:
            why = accel.missing()
            assert isinstance(why, str) and why, "an unavailable backend must say why in missing()"
        available.append(ok)
        return text

    if not checks.run("describe(), is_available(), missing()", describe):
        return checks.rows
    checks.run("declared names: device type, collective backend, environment", lambda: _names(accel))
    if available[0]:
        checks.run("device() has the declared type and computes", lambda: _device(accel))
        checks.run("dtype support: float32, and bf16 where supports_bf16() says so", lambda: _dtypes(accel))
        checks.run("a process group of the declared backend starts under that name", lambda: _process_group(accel))
        checks.run("memory_stats() is a dict of numbers", lambda: _memory(accel))
    else:
        def no_claims() -> str:
            assert accel.supports_bf16() is False, "supports_bf16() is true on a backend that is not available"
            stats = accel.memory_stats()
            assert stats == {}, f"memory_stats() of an unavailable backend should be empty, got {stats}"
            return "not available here: no bf16 claim, no memory stats"

        checks.run("unavailable: claims nothing about a device", no_claims)
    return checks.rows


def _declared_dist(accel: Any) -> str:
    """The collective backend the class declares (``dist``), else what ``dist_backend()`` returns."""
    return str(getattr(accel, "dist", "") or accel.dist_backend())


def _names(accel: Any) -> str:
    import torch

    from rlinf_cli.accel import TorchBackend

    device_type = str(getattr(accel, "device_type", ""))
    assert _NAME.match(device_type), f"device_type {device_type!r} is not a torch device type name"
    extension = getattr(accel, "extension", None)
    if not extension:  # no extension registers a new device type: torch itself must know it
        torch.device(device_type)
    dist = accel.dist_backend()
    assert isinstance(dist, str) and _NAME.match(dist), f"dist_backend() returned {dist!r}; expected a backend name"
    assert dist == _declared_dist(accel), f"dist_backend() returned {dist!r} but the class declares {_declared_dist(accel)!r}"
    envs = tuple(getattr(accel, "visible_devices_env", ()))
    bad = [v for v in envs if not _ENV.match(v)]
    assert not bad, f"visible_devices_env names {bad}, not environment variable names"
    env = accel.launch_env([0])
    assert isinstance(env, dict), f"launch_env() returned {type(env).__name__}; expected a dict"
    if envs:
        assert env.get(envs[0]) == "0", f"launch_env([0]) should set {envs[0]}=0, got {env}"
    ds = getattr(accel, "deepspeed_accelerator", None)
    if ds and isinstance(accel, TorchBackend):  # the built-in CPU leaves DeepSpeed to its own detection
        assert env.get("DS_ACCELERATOR") == ds, f"launch_env() should set DS_ACCELERATOR={ds}, got {env}"
    return f"device type {device_type!r}, process group {dist!r}" + (f", extension {extension}" if extension else "")


def _device(accel: Any) -> str:
    import torch

    dev = accel.device()
    assert isinstance(dev, torch.device), f"device() returned {type(dev).__name__}; expected torch.device"
    assert dev.type == accel.device_type, f"device() is of type {dev.type!r}; the backend declares {accel.device_type!r}"
    x = torch.ones(3, device=dev)
    assert float((x * 2).sum()) == 6.0, "2 * ones(3) does not sum to 6 on the device"
    return str(dev)


def _dtypes(accel: Any) -> str:
    import torch

    dev = accel.device()
    a = torch.arange(4.0, device=dev).reshape(2, 2)
    assert torch.equal((a @ a).cpu(), torch.tensor([[2.0, 3.0], [6.0, 11.0]])), "a float32 matmul is wrong on the device"
    bf16 = accel.supports_bf16()
    assert isinstance(bf16, bool), f"supports_bf16() returned {type(bf16).__name__}; expected bool"
    if bf16:
        b = a.to(torch.bfloat16)
        out = (b @ b).float().cpu()
        assert out.dtype == torch.float32 and torch.equal(out, torch.tensor([[2.0, 3.0], [6.0, 11.0]])), \
            "supports_bf16() is true but a bf16 matmul is wrong on the device"
    return "float32" + (", bfloat16" if bf16 else "; bf16 not claimed")


def _process_group(accel: Any) -> str:
    import torch
    import torch.distributed as dist

    name = accel.dist_backend()
    if not dist.is_available():
        return "skipped: this torch has no torch.distributed"
    if dist.is_initialized():
        return f"skipped: a process group is already running ({dist.get_backend()})"
    assert dist.is_backend_available(name), f"torch.distributed has no {name!r} backend here"
    accel.set_device()
    dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1)
    try:
        got = dist.get_backend()
        assert got == name, f"the process group reports backend {got!r}; the accelerator declares {name!r}"
        x = torch.ones(3, device=accel.device())
        dist.all_reduce(x)
        assert float(x.sum()) == 3.0, "all_reduce over one process changed the tensor"
    finally:
        dist.destroy_process_group()
    return f"{name}: one process, all_reduce on {accel.device()}"


def _memory(accel: Any) -> str:
    stats = accel.memory_stats()
    assert isinstance(stats, dict), f"memory_stats() returned {type(stats).__name__}; expected a dict"
    bad = [k for k, v in stats.items() if not isinstance(v, (int, float))]
    assert not bad, f"memory_stats() values {bad} are not numbers"
    return ", ".join(f"{k}={v:.2f}" for k, v in stats.items())
