"""The python tool's sandbox: each way code can misbehave ends as a tool error within its limit, and
nothing of a run is left behind (its working directory, its processes)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from rlinf_cli.api import ToolError
from rlinf_tools.sandbox import PythonTool, Sandbox, SandboxConfig

# small limits: each test ends in a few seconds even on a loaded machine
LIMITS = {"wall_s": 4.0, "cpu_s": 1, "memory_mb": 256, "processes": 16, "output_chars": 200}


@pytest.fixture(scope="module")
def tool() -> PythonTool:
    return PythonTool(LIMITS)


def _fails(tool: PythonTool, code: str) -> tuple[str, float]:
    began = time.monotonic()
    with pytest.raises(ToolError) as info:
        tool.call({"code": code})
    return str(info.value), time.monotonic() - began


def test_normal_code_returns_its_stdout(tool):
    assert tool.call({"code": "print(1234 * 5678)"}) == "7006652\n"
    assert tool.call({"code": "import math\nx = math.comb(10, 3)\nx + 1"}) == "121\n"  # a last expression is shown
    assert tool.call({"code": "import sys\nprint('oops', file=sys.stderr)"}) == "\n[stderr]\noops\n"


def test_an_exception_is_a_tool_error_with_its_traceback(tool):
    message, _ = _fails(tool, "1 / 0")
    assert "exit status 1" in message and "ZeroDivisionError" in message and 'File "main.py", line 1' in message


def test_an_endless_loop_ends_at_the_cpu_limit(tool):
    message, seconds = _fails(tool, "while True:\n    pass")
    assert "CPU time limit" in message
    assert seconds < LIMITS["wall_s"], seconds  # the CPU limit (1 s), not the wall clock, stopped it


def test_a_sleeper_ends_at_the_wall_clock_and_its_children_with_it(tool):
    shared = Path(tempfile.mkdtemp(prefix="rlinf-sandbox-test-"))  # not under tmp_path: the sandbox's user
    os.chmod(shared, 0o777)  # (nobody, under root) cannot enter pytest's private directories
    try:
        tool.call({"code": f"open({str(shared / 'reached')!r}, 'w').write('x')"})
        assert (shared / "reached").exists()  # the sandbox can write there: the check below can fail
        marker = shared / "alive"
        code = (f"import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(6)\n"
                f"    open({str(marker)!r}, 'w').write('x')\n    os._exit(0)\ntime.sleep(100)")
        message, seconds = _fails(tool, code)
        assert "timed out after 4 s (wall clock)" in message
        assert LIMITS["wall_s"] <= seconds < LIMITS["wall_s"] + 3, seconds
        time.sleep(3)  # the child left the process group; ending the sandbox must end it too
        if tool.isolation == "namespace":  # the PID namespace's end takes every process in it
            assert not marker.exists()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_a_fork_bomb_hits_the_process_limit(tool):
    message, seconds = _fails(tool, "import os\nwhile True:\n    os.fork()")
    assert "BlockingIOError" in message or "Resource temporarily unavailable" in message, message
    assert seconds < LIMITS["wall_s"] + 2, seconds


def test_a_10_gb_allocation_fails(tool):
    message, seconds = _fails(tool, "x = bytearray(10 * 1024 ** 3)\nprint(len(x))")
    assert "MemoryError" in message
    assert seconds < LIMITS["wall_s"], seconds


@pytest.mark.parametrize("network", ["auto", "guard"])
def test_a_network_call_fails(network):
    tool = PythonTool({**LIMITS, "network": network})
    if network == "guard":
        assert tool.isolation == "guard" and "socket guard" in tool.describe()
    message, seconds = _fails(tool, "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)\nprint('out')")
    assert "exit status 1" in message and seconds < 3.0, (message, seconds)
    if tool.isolation == "guard":
        assert "network access is disabled in this sandbox" in message
    else:
        assert "OSError" in message or "unreachable" in message or "LookupError" in message, message


def test_output_is_cut(tool):
    out = tool.call({"code": "print('x' * 100000)"})
    assert out.startswith("x" * 200) and "[output cut:" in out and len(out) < 300


def test_the_working_directory_is_removed(monkeypatch):
    made = []
    real = tempfile.mkdtemp

    def spy(*args, **kwargs):
        made.append(Path(real(*args, **kwargs)))
        return str(made[-1])

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    sandbox = Sandbox(SandboxConfig(**LIMITS))
    out = sandbox.run("import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\nos.chmod('a', 0o500)\n"
                      "print(os.getcwd())")
    assert out.returncode == 0 and out.stdout.strip() == str(made[0])  # the code ran in it, made files, locked it
    assert made and not made[0].exists()
    sandbox.run("while True: pass")  # removed after a killed run too
    assert not made[1].exists()


def test_bad_limits_are_one_line_errors():
    from rlinf_cli.errors import UserError

    with pytest.raises(UserError, match="network must be one of"):
        PythonTool({"network": "off"})
    with pytest.raises(UserError, match="'sim.tool_options.python.wal_s' is not an option"):
        PythonTool({"wal_s": 3})
