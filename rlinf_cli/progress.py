"""Live progress: a rich bar on a terminal, a line every ~10% otherwise (CI logs, pipes)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator

# Start-up work that runs longer than this says what it is doing (envs being made, restored).
SLOW_S = 2.0


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


@contextlib.contextmanager
def under_way(console: Any, what: str, enabled: bool = True) -> Iterator[None]:
    """Say ``what`` is under way when it takes longer than :data:`SLOW_S` (making 100,000 envs
    takes minutes, and no progress line comes until the first iteration ends): one line, printed
    above a live progress bar on a terminal (which shows the time elapsed). Quick work prints
    nothing."""
    if not enabled or console.quiet:
        yield
        return
    done = threading.Event()

    def say() -> None:
        if not done.wait(SLOW_S):
            console.print(f"{what} ...", highlight=False)

    if SLOW_S <= 0:  # no waiting: said before the work (and no thread that could race the work's end)
        say()
        yield
        return
    timer = threading.Thread(target=say, daemon=True)
    timer.start()
    try:
        yield
    finally:
        done.set()
        timer.join()
