"""The ``python`` tool: the model's code runs in a separate, limited process and its output comes back.

Each call gets a throw-away working directory (removed afterwards) and a fresh interpreter
(``python -I``: no user site, no PYTHON* variables) in a new session, started by
``sandbox_boot.py``, which applies the limits below before the code runs. The parent waits at
most ``wall_s`` and then kills the whole process group (and, with a PID namespace, everything the
code started). Output goes to files in the directory (so ``file_mb`` bounds it too) and comes back
cut to ``output_chars``. A run that ends badly (an exception, a limit, the wall clock) is a
:class:`~rlinf_cli.api.ToolError`: the model reads ``error: ...`` with the reason.

What the limits do and do not protect against: docs/llm.md ("The python tool's sandbox").
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rlinf_cli.api import ToolError, UserError, settings

BOOT = Path(__file__).with_name("sandbox_boot.py")
NETWORK_MODES = ("auto", "namespace", "guard")
PRELOAD = ("encodings.idna", "math", "cmath", "fractions", "decimal", "statistics", "random", "itertools", "functools", "operator",
           "collections", "heapq", "bisect", "re", "json", "string", "datetime", "textwrap", "dataclasses", "copy")
_SIGNALS = {signal.SIGXCPU: "the CPU time limit", signal.SIGKILL: "a kill (CPU time or memory limit)",
            signal.SIGXFSZ: "the file size limit", signal.SIGSEGV: "a crash (SIGSEGV)"}


@dataclass(frozen=True)
class SandboxConfig:
    wall_s: float = 10.0  # wall-clock limit of a call; then the whole process group is killed
    cpu_s: int = 5  # CPU seconds (RLIMIT_CPU): an endless loop ends here
    memory_mb: int = 512  # address space (RLIMIT_AS): a larger allocation raises MemoryError
    processes: int = 16  # processes of the sandbox's user (RLIMIT_NPROC): a fork bomb stops here
    file_mb: int = 16  # largest file the code may write, its output included (RLIMIT_FSIZE)
    open_files: int = 64  # open file descriptors (RLIMIT_NOFILE)
    output_chars: int = 1000  # stdout and stderr returned to the model, cut beyond
    max_code_chars: int = 20000  # longer code is refused
    network: str = "auto"  # auto: a network namespace where the kernel gives one, else the socket guard | namespace: refuse to run without | guard
    user: str = "nobody"  # started as root, the code runs as this user (root ignores the process limit)
    python: str | None = None  # interpreter; null = the one running rlinf
    # imported before the switch to `user`, who may not be able to read the interpreter's files
    preload: tuple[str, ...] = PRELOAD

    def __post_init__(self) -> None:
        if self.network not in NETWORK_MODES:
            raise ValueError(f"network must be one of {', '.join(NETWORK_MODES)}, got {self.network!r}")
        if min(self.wall_s, self.cpu_s, self.memory_mb, self.processes, self.file_mb, self.open_files,
               self.output_chars, self.max_code_chars) <= 0:
            raise ValueError("every limit must be > 0")


@dataclass(frozen=True)
class Outcome:
    """How one sandboxed run ended."""

    returncode: int | None  # None: killed at the wall-clock limit
    stdout: str
    stderr: str
    seconds: float
    isolation: str  # "namespace" or "guard": how the network was kept out


class Sandbox:
    """Runs code under :class:`SandboxConfig`'s limits; :meth:`run` never raises for what the code does."""

    def __init__(self, cfg: SandboxConfig):
        self.cfg = cfg
        self.boot = BOOT.read_text()
        self.uid = self.gid = -1
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam(cfg.user)
            except KeyError:
                raise UserError(f"sandbox user '{cfg.user}' does not exist; set sim.tool_options.python.user "
                                f"to an unprivileged user") from None
            self.uid, self.gid = entry.pw_uid, entry.pw_gid

    def limits(self) -> dict[str, Any]:
        c = self.cfg
        return {"cpu_s": c.cpu_s, "memory_bytes": c.memory_mb << 20, "processes": c.processes,
                "file_bytes": c.file_mb << 20, "open_files": c.open_files, "network": c.network,
                "uid": self.uid, "gid": self.gid, "preload": list(c.preload)}

    def run(self, code: str) -> Outcome:
        workdir = Path(tempfile.mkdtemp(prefix="rlinf-python-"))
        try:
            return self._run_in(workdir, code)
        finally:
            remove_tree(workdir)

    def _run_in(self, workdir: Path, code: str) -> Outcome:
        (workdir / "main.py").write_text(code, encoding="utf-8")
        if self.uid >= 0:  # the code runs as another user: the directory is its own
            for path in (workdir, workdir / "main.py"):
                os.chown(path, self.uid, self.gid)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        report_r, report_w = os.pipe()
        args = [self.cfg.python or sys.executable, "-I", "-c", self.boot, str(workdir), json.dumps(self.limits()),
                str(report_w)]
        began = time.monotonic()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                        cwd=workdir, start_new_session=True, pass_fds=(report_w,))
            finally:
                os.close(report_w)
            try:
                returncode: int | None = proc.wait(timeout=self.cfg.wall_s)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:
                kill_group(proc)
            with os.fdopen(report_r, "rb") as report:
                isolation = report.read(32).decode() or "none"
            # the start of the output, the end of the errors (where a traceback says what went wrong)
            return Outcome(returncode, read_cut(out, self.cfg.output_chars), read_cut(err, self.cfg.output_chars, True),
                           time.monotonic() - began, isolation)

    def describe_failure(self, outcome: Outcome) -> str:
        """Why a run failed, in one line plus the tail of its error output."""
        c = self.cfg
        if outcome.returncode is None:
            return f"timed out after {c.wall_s:g} s (wall clock); the process was killed"
        code = outcome.returncode
        sig = -code if code < 0 else code - 128 if code > 128 else 0
        tail = outcome.stderr.strip()[-600:]
        if sig and sig in _SIGNALS:
            limits = f" (cpu {c.cpu_s} s, memory {c.memory_mb} MB, files {c.file_mb} MB)"
            return f"stopped by {_SIGNALS[signal.Signals(sig)]}{limits}" + (f"\n{tail}" if tail else "")
        return f"exit status {code}" + (f"\n{tail}" if tail else "")


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group the run started (whatever the code left behind), then reap."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def read_cut(f: Any, limit: int, tail: bool = False) -> str:
    """The first (``tail``: last) ``limit`` characters of a file, with a note of how much was cut."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - limit * 4) if tail else 0)
    text = f.read(limit * 4).decode("utf-8", errors="replace")
    if len(text) <= limit and size <= limit * 4:
        return text
    note = f"[output cut: {size} bytes in all]"
    return f"{note}\n{text[-limit:]}" if tail else f"{text[:limit]}\n{note}"


def remove_tree(path: Path) -> None:
    """Remove the working directory, whatever permissions the code left on what it made."""
    def unlock(func: Any, target: str, _exc: Any) -> None:
        os.chmod(os.path.dirname(target), 0o700)
        if os.path.isdir(target):
            os.chmod(target, 0o700)
        func(target)

    shutil.rmtree(path, onerror=unlock)


class PythonTool:
    """``python({"code": "print(1234*5678)"})`` -> ``"7006652\\n"``."""

    name = "python"
    description = ("Runs Python 3 code in a sandbox and returns what it prints (the value of a last bare "
                   "expression is printed too). No network, no files kept between calls.")
    parameters = {"type": "object", "properties": {"code": {"type": "string", "description": "Python source"}},
                  "required": ["code"], "additionalProperties": False}
    example = {"code": "print(1234 * 5678)"}

    def __init__(self, cfg: Mapping[str, Any] | None = None):
        self.cfg = settings.build(SandboxConfig, cfg, "sim.tool_options.python")
        self.sandbox = Sandbox(self.cfg)
        self.timeout_s = self.cfg.wall_s + 10.0  # the core's own limit: after the sandbox's kill and cleanup
        probe = self.sandbox.run("pass")
        if probe.returncode != 0:
            raise UserError(f"the python tool's sandbox does not start here: {self.sandbox.describe_failure(probe)}")
        self.isolation = probe.isolation

    def describe(self) -> str:
        c = self.cfg
        network = "network namespace" if self.isolation == "namespace" else "socket guard (no network namespace here)"
        who = f", as user {c.user}" if os.geteuid() == 0 else ""
        return (f"python sandbox: {network}{who}; wall {c.wall_s:g} s, cpu {c.cpu_s} s, memory {c.memory_mb} MB, "
                f"{c.processes} processes, files {c.file_mb} MB, output {c.output_chars} chars")

    def call(self, arguments: Mapping[str, Any]) -> str:
        code = str(arguments["code"])
        if len(code) > self.cfg.max_code_chars:
            raise ToolError(f"code longer than {self.cfg.max_code_chars} characters")
        outcome = self.sandbox.run(code)
        if outcome.returncode != 0:
            raise ToolError(self.sandbox.describe_failure(outcome))
        return outcome.stdout + (f"\n[stderr]\n{outcome.stderr}" if outcome.stderr.strip() else "")
