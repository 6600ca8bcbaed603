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
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

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


def _short(text: str) -> str:
    """A devices cell: ``"not detected (why)"`` -> ``"not detected"``, ``"error: TypeError: ..."`` ->
    ``"error: TypeError"``; the whole text goes under the table."""
    if text.startswith("error: "):
        return ": ".join(text.split(": ", 2)[:2])
    return text.split(" (", 1)[0]


def _verified_cell(row: dict[str, Any]) -> str:
    """A date and a count, or ``never``; the record itself goes under the table."""
    runs = int(row.get("verified_runs", 0))
    if not runs:
        return "-" if not row["installed"] or row["verified"] == "?" else "never"
    date = str(row["verified"]).split(",", 1)[0]
    return date + (f" (+{runs - 1})" if runs > 1 else "")


def accelerator_table(rows: list[dict[str, Any]]) -> Any:
    """One short line (two at most on an 80-column terminal) per backend: which package, its
    devices in a word or a count, collective and DeepSpeed names, when last verified. The whys and
    the install commands are too long for cells: :func:`accelerator_details` prints them below."""
    table = Table(title="accelerators")
    table.add_column("backend", no_wrap=True)
    table.add_column("package", no_wrap=True)  # name, then version on a second line: a name is never cut
    table.add_column("devices")
    table.add_column("collective / DS")
    table.add_column("verified", no_wrap=True)
    for row in rows:
        text = escape(_short(str(row["devices"])))
        if row["available"]:
            devices = f"[green]{text}"
        elif not row["installed"]:
            devices = "[dim]not installed"
        elif text.startswith("error"):
            devices = f"[red]{text}"
        else:
            devices = f"[yellow]{text}"
        package = escape(str(row["package"])).replace(" ", "\n", 1) if row["installed"] else "-"
        table.add_row(row["backend"], package, devices,
                      escape(row["collective"]), escape(_verified_cell(row)))
    return table


def accelerator_details(console: Console, rows: list[dict[str, Any]]) -> None:
    """Under the table, per backend: why its devices are missing, what it was verified on, and the
    command that installs what is missing, each whole (a command is never wrapped or cut)."""
    for row in rows:
        lines = []
        if row["installed"] and not row["available"]:
            lines.append(f"devices: {row['devices']}")
        if row["installed"] and row["verified"] not in ("?", "-"):
            lines.append(f"verified: {row['verified']}")
        if not lines and not row.get("install"):
            continue
        console.print(f"[bold]{escape(row['backend'])}[/]" + ("" if row["installed"] else " (not installed)"))
        for line in lines:
            console.print(Padding(Text(line), (0, 0, 0, 2)))
        if row.get("install"):
            console.print(f"  install: {escape(row['install'])}", soft_wrap=True)


def cluster_lines() -> list[str]:
    """What each executor that knows a cluster reports about it (``executor=ray``: the Ray cluster
    this machine is connected to, a line per node). A broken report is a line, never a traceback."""
    lines: list[str] = []
    for spec in sorted(get_registry().specs("executor").values(), key=lambda s: s.name):
        try:
            fn = getattr(spec.load(), "cluster_report", None)
            lines.extend((fn() or []) if fn is not None else [])
        except Exception as exc:  # a broken plugin is reported, not fatal
            lines.append(f"{spec.name}: error: {type(exc).__name__}: {exc}")
    return lines


def report(console: Console | None = None) -> None:
    console = console or Console()
    reg = get_registry()
    console.print(f"rlinf {__version__} on Python {platform.python_version()} ({platform.machine()})")
    rows = accelerator_rows()
    console.print(accelerator_table(rows))
    accelerator_details(console, rows)
    counts = {kind: len(reg.specs(kind)) for kind in ("simulator", "model", "algorithm", "executor")}
    console.print("plugins: " + ", ".join(f"{n} {k}s" for k, n in counts.items()) + " (rlinf plugins list)")
    for b in getattr(reg, "broken", []):  # installed entry points whose module failed to import
        console.print(f"[red]broken plugin:[/] {escape(b.package)} {escape(b.version)} ({escape(b.entry_point)}): "
                      f"{escape(b.error)}")
    for line in cluster_lines():
        console.print(escape(line), soft_wrap=True)
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
