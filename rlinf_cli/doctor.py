"""`rlinf doctor`: what is installed and usable on this machine."""

from __future__ import annotations

import platform

from rich.console import Console
from rich.table import Table

from rlinf_cli import __version__
from rlinf_cli.registry import get_registry


def report() -> None:
    console = Console()
    reg = get_registry()
    console.print(f"rlinf {__version__} on Python {platform.python_version()} ({platform.machine()})")
    table = Table(title="accelerators")
    for col in ("name", "package", "status"):
        table.add_column(col)
    for spec in sorted(reg.specs("accelerator").values(), key=lambda s: -int(s.attrs.get("priority", 0))):
        try:
            accel = spec.load()()
            status = ("[green]available[/] " if accel.is_available() else "[dim]") + accel.describe()
        except Exception as exc:  # a broken backend is reported, not fatal
            status = f"[red]error: {type(exc).__name__}: {exc}"
        table.add_row(spec.name, spec.package, status)
    console.print(table)
    counts = {kind: len(reg.specs(kind)) for kind in ("simulator", "model", "algorithm", "executor")}
    console.print("plugins: " + ", ".join(f"{n} {k}s" for k, n in counts.items()) + " (rlinf plugins list)")
    try:
        import mlflow

        console.print(f"tracking: mlflow {mlflow.__version__}, embedded sqlite store by default")
    except ImportError:
        console.print("tracking: [red]mlflow is not installed[/]")
