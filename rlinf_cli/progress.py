"""Live progress: a rich bar on a terminal, a line every ~10% otherwise (CI logs, pipes)."""

from __future__ import annotations

import time
from typing import Any


class Progress:
    def __init__(self, console: Any, description: str, total: float, unit: str, enabled: bool = True):
        self.console = console
        self.total = max(float(total), 1.0)
        self.unit = unit
        self.description = description
        self.enabled = enabled and not console.quiet
        self.done = 0.0
        self.t0 = time.monotonic()
        self._next_line = 0.1
        self._bar = None
        if self.enabled and console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                console=console, transient=False,
            )
            self._task = self._bar.add_task(description, total=self.total, rate="", info="")
            self._bar.start()

    def rate(self) -> float:
        return self.done / max(time.monotonic() - self.t0, 1e-9)

    def update(self, advance: float, info: str = "") -> None:
        self.done += advance
        rate = f"{self.rate():,.0f} {self.unit}/s"
        if self._bar is not None:
            self._bar.update(self._task, completed=min(self.done, self.total), rate=rate, info=info)
        elif self.enabled and self.done / self.total >= self._next_line:
            self.console.print(f"{self.description}: {self.done:,.0f}/{self.total:,.0f} {self.unit} ({rate}) {info}", highlight=False)
            while self._next_line <= self.done / self.total:
                self._next_line += 0.1

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
