"""`rlinf doctor`: what is installed and usable on this machine.

Per accelerator backend: the package that provides it (or that it is not installed), the
devices it detected, its collective and DeepSpeed names, what it was verified on (the package's
``verified.json``, never prose) and the one command that installs what is missing. A broken
backend is a row that says so, never a traceback.
"""

from __future__ import annotations

import platform
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlinf_cli import __version__
from rlinf_cli.registry import get_registry

# First-party backend packages, so that doctor can say how to get one that is not installed.
# Only a hint list: backends are found through entry points, whatever their package.
FIRST_PARTY = {"cuda": "rlinf-accel-cuda", "rocm": "rlinf-accel-rocm", "ascend": "rlinf-accel-ascend",
               "musa": "rlinf-accel-musa"}


def accelerator_rows() -> list[dict[str, Any]]:
    """One dict per backend (installed ones by priority, then first-party ones not installed)."""
    reg = get_registry()
    rows: list[dict[str, Any]] = []
    specs = sorted(reg.specs("accelerator").values(), key=lambda s: (-int(s.attrs.get("priority", 0)), s.name))
    for spec in specs:
        row: dict[str, Any] = {"backend": spec.name, "installed": True, "package": f"{spec.package} {spec.version}"}
        try:
            accel = spec.load()()
            available = bool(accel.is_available())
            record = accel.hardware_record()
            ds = getattr(accel, "deepspeed_accelerator", None)
            row.update(available=available, devices=accel.describe(),
                       collective=f"{accel.dist_backend()} / {ds or 'none'}",
                       verified=record.summary() if record is not None else "no verified.json in the package",
                       verified_runs=len(record.verified) if record is not None else 0,
                       install=accel.install_hint() or "")
        except Exception as exc:  # a broken plugin is reported, not fatal
            row.update(available=False, devices=f"error: {type(exc).__name__}: {exc}", collective="?", verified="?",
                       verified_runs=0, install=f"pip install --force-reinstall {spec.package}")
        rows.append(row)
    for name, package in FIRST_PARTY.items():
        if name not in reg.specs("accelerator"):
            rows.append({"backend": name, "installed": False, "package": "not installed", "available": False,
                         "devices": "-", "collective": "-", "verified": "-", "verified_runs": 0,
                         "install": f"pip install {package}"})
    return rows


def report() -> None:
    console = Console()
    reg = get_registry()
    console.print(f"rlinf {__version__} on Python {platform.python_version()} ({platform.machine()})")
    table = Table(title="accelerators")
    for col in ("backend", "package", "devices", "collective / DeepSpeed", "verified on real hardware", "to install"):
        table.add_column(col)
    for row in accelerator_rows():
        text = escape(str(row["devices"]))
        if row["available"]:
            devices = f"[green]{text}"
        elif not row["installed"]:
            devices = "[dim]-"
        elif text.startswith("error"):
            devices = f"[red]{text}"
        else:
            devices = f"[yellow]{text}"
        table.add_row(row["backend"], escape(row["package"]), devices, escape(row["collective"]),
                      escape(row["verified"]), escape(row["install"] or "-"))
    console.print(table)
    counts = {kind: len(reg.specs(kind)) for kind in ("simulator", "model", "algorithm", "executor")}
    console.print("plugins: " + ", ".join(f"{n} {k}s" for k, n in counts.items()) + " (rlinf plugins list)")
    for b in getattr(reg, "broken", []):  # installed entry points whose module failed to import
        console.print(f"[red]broken plugin:[/] {escape(b.package)} {escape(b.version)} ({escape(b.entry_point)}): "
                      f"{escape(b.error)}")
    try:
        import mlflow

        console.print(f"tracking: mlflow {mlflow.__version__}, embedded sqlite store by default")
    except ImportError:
        console.print("tracking: [red]mlflow is not installed[/]")
    try:
        import av

        console.print(f"video: PyAV {av.__version__} (eval video=N, LeRobot datasets)")
    except ImportError:
        console.print("video: [red]PyAV is not installed[/] (pip install av): no eval videos or LeRobot datasets")
