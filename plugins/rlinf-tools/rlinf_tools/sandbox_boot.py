"""The first code of a sandboxed Python process (``python -I -c <this file> WORKDIR LIMITS REPORT_FD``).

Run as its own script in a fresh interpreter (never imported by rlinf), so that it is the only
thread of the process when it forks and sets limits. In order:

1. Namespaces: a new network namespace (no interface but a down loopback: no network) and a new
   PID namespace, as root or inside a new user namespace; where the kernel refuses, nothing.
2. With a PID namespace it forks twice: the first child is the namespace's init (it only waits),
   the second runs the code. When the init exits, the kernel kills everything left in the
   namespace, including processes that left the process group.
3. In the process that runs the code: the modules of ``preload`` imported (the sandbox user may
   not be able to read the interpreter's files, e.g. a Python under /root), resource limits (CPU seconds, address space, processes,
   file size, open files, no core files), then, when started as root, the switch to an
   unprivileged user (root ignores the process limit), then the working directory.
4. Without a network namespace, a guard: ``socket`` objects and name lookups raise
   PermissionError. A guard in the interpreter, not a boundary: a subprocess or ctypes passes it.
5. The code of ``main.py``, with the value of a last bare expression printed (as a REPL would).

The isolation in force ("namespace" or "guard") is written to REPORT_FD before the code runs.
"""

import ast
import ctypes
import json
import os
import resource
import socket
import sys
import traceback

import _socket

CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NETWORK_OFF = "network access is disabled in this sandbox"


def unshare(want_pid: bool) -> tuple[bool, bool]:
    """(network namespace, PID namespace) that this process now has for its children."""
    unshare_call = getattr(ctypes.CDLL(None, use_errno=True), "unshare", None)
    if unshare_call is None:  # not Linux
        return False, False
    tries = [CLONE_NEWNET | CLONE_NEWPID, CLONE_NEWNET] if want_pid else [CLONE_NEWNET]
    if os.geteuid() != 0:  # an unprivileged user may create namespaces inside a user namespace
        tries = [CLONE_NEWUSER | flags for flags in tries]
    for flags in tries:
        if unshare_call(flags) == 0:
            return True, bool(flags & CLONE_NEWPID)
    return False, False


def relay(pid: int) -> None:
    """Wait for ``pid`` (reaping any other child meanwhile) and exit as it did (128+N: signal N)."""
    while True:
        try:
            done, status = os.wait()
        except ChildProcessError:
            os._exit(70)
        if done == pid:
            os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))


def set_limits(limits: dict) -> None:
    cpu = int(limits["cpu_s"])
    for res, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                       (resource.RLIMIT_AS, (limits["memory_bytes"],) * 2),
                       (resource.RLIMIT_NPROC, (limits["processes"],) * 2),
                       (resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2),
                       (resource.RLIMIT_NOFILE, (limits["open_files"],) * 2),
                       (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(res, value)


def drop_privileges(uid: int, gid: int) -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)


def guard_network() -> None:
    def refuse(*args, **kwargs):
        raise PermissionError(NETWORK_OFF)

    class NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            refuse()

    socket.socket = _socket.socket = NoSocket
    for name in ("socketpair", "fromfd", "create_connection", "create_server", "getaddrinfo", "gethostbyname",
                 "gethostbyname_ex", "gethostbyaddr"):
        for module in (socket, _socket):
            if hasattr(module, name):
                setattr(module, name, refuse)


def run_code(path: str) -> None:
    source = open(path, encoding="utf-8").read()
    tree = ast.parse(source, "main.py")
    if tree.body and isinstance(tree.body[-1], ast.Expr):  # show a last bare expression's value
        last = tree.body[-1]
        show = ast.Expr(ast.Call(ast.Name("__show__", ast.Load()), [last.value], []))
        tree.body[-1] = ast.copy_location(show, last)
        ast.fix_missing_locations(tree)
    scope = {"__name__": "__main__", "__show__": lambda v: None if v is None else print(repr(v))}
    try:
        exec(compile(tree, "main.py", "exec"), scope)
    except SystemExit:
        raise
    except BaseException as exc:  # the traceback of the code alone, without this file's frame
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        sys.stderr.flush()
        os._exit(1)


def main() -> None:
    workdir, limits, report = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    netns, pidns = unshare(want_pid=True) if limits["network"] != "guard" else (False, False)
    os.write(report, b"namespace" if netns else b"guard")
    os.close(report)
    if netns is False and limits["network"] == "namespace":
        sys.stderr.write("no network namespace could be created here (sandbox network=namespace)\n")
        os._exit(71)
    if pidns:
        init = os.fork()
        if init:
            relay(init)
        code = os.fork()  # the init: it only waits, so the code never runs as PID 1
        if code:
            relay(code)
    for module in limits["preload"]:
        try:
            __import__(module)
        except ImportError:
            pass  # the code's own import says so, if it needs it
    set_limits(limits)
    drop_privileges(limits["uid"], limits["gid"])
    os.chdir(workdir)
    if not netns:
        guard_network()
    run_code(os.path.join(workdir, "main.py"))
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main()
