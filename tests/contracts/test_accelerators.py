"""Accelerator backends as separate packages: each backend's logic against a fake vendor runtime,
`rlinf doctor` on this CPU machine, and installing/uninstalling one backend package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import torch

from rlinf_cli import DISTRIBUTION
from rlinf_cli.registry import get_registry

REPO = Path(__file__).resolve().parents[2]
FAKES = Path(__file__).resolve().parents[1] / "fake_accel"


def _fake_runtime_class() -> type:
    # loaded by path: putting tests/fake_accel on sys.path for good would make the fake torch_npu importable
    import importlib.util

    if "fake_runtime" not in sys.modules:
        spec = importlib.util.spec_from_file_location("fake_runtime", FAKES / "fake_runtime.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["fake_runtime"] = module
    return sys.modules["fake_runtime"].FakeDeviceRuntime


FakeDeviceRuntime = _fake_runtime_class()

GPU_BACKENDS = ("cuda", "rocm", "ascend", "musa")


def backend(name: str):
    return get_registry().load("accelerator", name)()


@pytest.fixture
def fake_vendor(monkeypatch):
    """Install a fake vendor runtime for one backend; returns it."""

    def install(name: str, count: int = 2):
        monkeypatch.setenv("FAKE_DEVICES", str(count))
        if name in ("cuda", "rocm"):
            rt = FakeDeviceRuntime(count, "FakeGPU")
            monkeypatch.setattr(torch, "cuda", rt)
            monkeypatch.setattr(torch.version, "cuda", "12.8" if name == "cuda" else None)
            monkeypatch.setattr(torch.version, "hip", "6.4.1" if name == "rocm" else None)
            return rt
        module = {"ascend": "torch_npu", "musa": "torch_musa"}[name]
        namespace = {"ascend": "npu", "musa": "musa"}[name]
        monkeypatch.delitem(sys.modules, module, raising=False)
        monkeypatch.syspath_prepend(str(FAKES))
        monkeypatch.setattr(torch, namespace, None, raising=False)  # torch has none: removed after the test
        __import__(module)  # the fake extension installs torch.<namespace>, like the real one
        imported.append(module)
        return getattr(torch, namespace)

    imported: list[str] = []
    yield install
    for module in imported:  # later tests (and DeepSpeed's own probing) must not find the fake
        sys.modules.pop(module, None)


def test_every_backend_is_its_own_package():
    reg = get_registry()
    packages = {name: reg.get("accelerator", name).package for name in ("cpu", *GPU_BACKENDS)}
    assert packages == {"cpu": DISTRIBUTION, "cuda": "rlinf-accel-cuda", "rocm": "rlinf-accel-rocm",
                        "ascend": "rlinf-accel-ascend", "musa": "rlinf-accel-musa"}


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_backend_says_not_detected_on_this_cpu(name):
    accel = backend(name)
    assert not accel.is_available() and accel.device_count() == 0
    assert accel.describe().startswith("not detected (")
    assert accel.install_hint().startswith("pip install")
    assert accel.memory_stats() == {} and accel.supports_bf16() is False
    record = accel.hardware_record()
    assert record is not None and record.backend == name
    assert record.verified == () and "never on real hardware" in record.summary()


EXPECT = {  # backend -> (dist backend, device type, visible-devices variable, DeepSpeed name, bf16)
    "cuda": ("nccl", "cuda", "CUDA_VISIBLE_DEVICES", "cuda", True),
    "rocm": ("nccl", "cuda", "HIP_VISIBLE_DEVICES", "cuda", True),
    "ascend": ("hccl", "npu", "ASCEND_RT_VISIBLE_DEVICES", "npu", True),
    "musa": ("mccl", "musa", "MUSA_VISIBLE_DEVICES", None, False),
}


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_backend_logic_with_a_fake_vendor_runtime(name, fake_vendor, monkeypatch):
    rt = fake_vendor(name, count=2)
    accel = backend(name)
    dist, dtype, visible, ds, bf16 = EXPECT[name]
    assert accel.is_available() and accel.missing() is None and accel.device_count() == 2
    assert "2 x" in accel.describe() and "#0" in accel.describe() and accel.install_hint() is None
    assert accel.dist_backend() == dist and accel.device_type == dtype and accel.supports_bf16() is bf16
    # LOCAL_RANK -> device: rank r on device r mod n, made current before the process group starts
    for rank, index in (("0", 0), ("1", 1), ("3", 1)):
        monkeypatch.setenv("LOCAL_RANK", rank)
        assert accel.device_index() == index
        accel.set_device()
        assert rt.current == index
    if dtype == "cuda":  # torch.device works for cuda on any build; npu/musa need the real extension
        assert accel.device() == torch.device("cuda", 1)
    stats = accel.memory_stats()  # LOCAL_RANK=3 -> device 1: 2 GiB allocated in the fake
    assert stats == {"mem_allocated_gb": 2.0, "mem_peak_gb": 4.0, "mem_reserved_gb": 6.0, "mem_total_gb": 64.0}
    env = accel.launch_env([0, 1])
    assert env[visible] == "0,1" and env.get("DS_ACCELERATOR") == ds
    monkeypatch.setenv("DS_ACCELERATOR", "unset")  # recorded, so the variable is removed after the test
    monkeypatch.delenv("DS_ACCELERATOR")
    accel.prepare_deepspeed()
    assert os.environ.get("DS_ACCELERATOR") == ds


def test_cuda_and_rocm_do_not_claim_each_others_builds(fake_vendor):
    fake_vendor("rocm")
    assert backend("rocm").is_available() and not backend("cuda").is_available()
    assert "ROCm build" in backend("cuda").describe() and "HIP 6.4.1" in backend("rocm").describe()


def test_auto_picks_a_detected_gpu_over_cpu(fake_vendor):
    from rlinf_cli.stages.common import select_accelerator

    assert select_accelerator("auto").name == "cpu"
    fake_vendor("ascend")
    assert select_accelerator("auto").name == "ascend"


def test_a_vendor_runtime_with_no_device_is_not_available(fake_vendor):
    fake_vendor("musa", count=0)
    accel = backend("musa")
    assert not accel.is_available() and "no device detected" in accel.describe()
    assert accel.install_hint() is None  # the runtime is there: nothing to install, the device is missing


def doctor_rows(out: str) -> dict[str, str]:
    """``rlinf doctor``'s table: backend -> its row's cells (the lines of a row joined)."""
    from rich_tables import cells, table_rows

    return {c[0]: " ".join(c) for c in map(cells, table_rows(out))}


def doctor_details(out: str) -> dict[str, str]:
    """What doctor prints under the table, per backend (a line with its name, then indented lines)."""
    details: dict[str, str] = {}
    name = None
    for line in out.split("└", 1)[1].splitlines()[1:]:
        if line.startswith("  ") and name:
            details[name] += " " + line.strip()
        else:
            name = line.split(" ")[0] if line.split(" ")[0] in GPU_BACKENDS + ("cpu",) else None
            if name:
                details[name] = ""
    return details


def test_doctor_table_on_this_cpu_machine(cli_proc):
    res = cli_proc("doctor")
    assert res.code == 0 and "Traceback" not in res.out + res.err, res.err
    rows, details = doctor_rows(res.out), doctor_details(res.out)
    for name in GPU_BACKENDS:
        assert "not detected" in rows[name] and "never" in rows[name], rows[name]
        assert "never on real hardware" in details[name] and "install: pip install" in details[name], details[name]
    assert f"{DISTRIBUTION} 0.1.0" in rows["cpu"] and "gloo" in rows["cpu"] and "2026-" in rows["cpu"]
    assert "verified: 2026-" in details["cpu"] and "install" not in details["cpu"]


def test_doctor_shows_devices_of_a_fake_vendor_extension(cli_proc):
    res = cli_proc("doctor", env={"PYTHONPATH": str(FAKES), "FAKE_DEVICES": "4"})
    assert res.code == 0, res.err
    row = doctor_rows(res.out)["ascend"]
    assert "4 x Ascend910B-fake" in row and "hccl / npu" in row


def test_rlinf_doctor_lists_accelerator_rows_as_data():
    from rlinf_cli.doctor import accelerator_rows

    rows = {r["backend"]: r for r in accelerator_rows()}
    assert rows["cpu"]["available"] and rows["cpu"]["verified_runs"] >= 1
    assert all(not rows[n]["available"] and rows[n]["verified_runs"] == 0 for n in GPU_BACKENDS)


def _accelerators(python: Path) -> set[str]:
    out = subprocess.run([str(python), "-m", "rlinf_cli", "plugins", "list", "--json"], capture_output=True, text=True,
                         timeout=120, check=True)
    return {r["name"] for r in json.loads(out.stdout) if r["kind"] == "accelerator"}


@pytest.mark.slow
def test_pip_install_and_uninstall_of_the_rocm_package_in_a_fresh_venv(tmp_path):
    """A fresh venv with rlinf alone; `pip install -e plugins/rlinf-accel-rocm` adds `rocm`, uninstalling removes it.

    The venv borrows this environment's third-party packages (torch, mlflow, ...) through a path
    entry that leaves out every rlinf distribution, so only what is installed into it is rlinf's.
    """
    site = Path(sysconfig.get_paths()["purelib"])
    deps = tmp_path / "deps"
    deps.mkdir()
    for entry in site.iterdir():
        if not entry.name.lower().replace("-", "_").lstrip("_").startswith(("rlinf", "editable__.rlinf", "editable___rlinf")):
            (deps / entry.name).symlink_to(entry)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    target_site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                               text=True).strip())
    (target_site / "borrowed_deps.pth").write_text(f"import site; site.addsitedir({str(deps)!r})\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "-q"]
    install = [*pip, "install", "--no-deps", "--no-build-isolation", "-e"]
    subprocess.run([*install, str(REPO)], check=True, capture_output=True, timeout=300)
    assert _accelerators(python) == {"cpu"}

    subprocess.run([*install, str(REPO / "plugins" / "rlinf-accel-rocm")], check=True, capture_output=True, timeout=300)
    assert _accelerators(python) == {"cpu", "rocm"}
    doctor = subprocess.run([str(python), "-m", "rlinf_cli", "doctor"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "COLUMNS": "200"})
    assert doctor.returncode == 0 and "Traceback" not in doctor.stderr
    row = doctor_rows(doctor.stdout)["rocm"]
    assert "rlinf-accel-rocm 0.1.0" in row and "not detected" in row

    subprocess.run([*pip, "uninstall", "-y", "rlinf-accel-rocm"], check=True, capture_output=True, timeout=300)
    assert _accelerators(python) == {"cpu"}
    doctor = subprocess.run([str(python), "-m", "rlinf_cli", "doctor"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "COLUMNS": "200"})
    assert "not installed" in doctor_rows(doctor.stdout)["rocm"]
    assert "install: pip install rlinf-accel-rocm" in doctor_details(doctor.stdout)["rocm"]
