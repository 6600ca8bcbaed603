"""``rlinf env serve``: any installed simulator plugin, served over gRPC.

Why gRPC (and not ZeroMQ): a session is a bidirectional stream, so "connection" has a meaning
the server can act on: a client that goes away cancels its stream and the server kills that
session's worker; a token is checked when each stream or call opens; TLS, message size limits
and keepalive are built in. Messages are msgpack (:mod:`rlinf_cli.remote.wire`), never pickle.

Each session hosts one :class:`~rlinf_cli.runtime.workers.EnvWorker` (the client's shards) in a
worker process of its own, started like the local executor's
(:class:`~rlinf_cli.runtime.procs.ProcessWorker`): sessions step in parallel on the server's
cores, and a simulator that crashes takes down its session's process, never the server. The
server's own thread only checks messages (:mod:`rlinf_cli.remote.messages`) and relays them.

Security: the server binds 127.0.0.1 unless told otherwise, and refuses to bind anything else
without a token. A token, when set, is checked on every stream and call (``hmac.compare_digest``).
A message over the size limit is refused by gRPC from its length, before it is buffered; one that
does not decode or breaks the protocol ends that session with a logged reason; neither reaches
the simulator nor stops the server. Streams and calls beyond :func:`max_streams` are refused, so
what received messages can hold is bounded (docs/remote.md, "Memory").
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import logging
import multiprocessing as mp
import os
import pickle
import signal
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rlinf_cli import __version__
from rlinf_cli.api import BatchedSimulator, EnvSpec, Simulator
from rlinf_cli.errors import UserError
from rlinf_cli.registry import make_simulator
from rlinf_cli.remote import wire
from rlinf_cli.remote.messages import (LOOPBACK, ProtocolError, ServeConfig, Session, check_expert_request,
                                       max_streams)
from rlinf_cli.runtime.procs import ProcessWorker
from rlinf_cli.runtime.workers import RemoteError, WorkerDied, last_line
from rlinf_cli.settings import plain

log = logging.getLogger("rlinf.env")


def _kill_quietly(worker: Any) -> None:
    with contextlib.suppress(Exception):  # already gone, or being closed by its session's thread
        worker.kill()


class EnvServer:
    """Serves one simulator. ``start()`` binds and returns the port; ``stop()`` ends every session."""

    def __init__(self, simulator: Simulator, cfg: ServeConfig, label: str = ""):
        self.simulator = simulator
        self.cfg = cfg
        self.label = label or type(simulator).__name__
        self.token = cfg.token if cfg.token is not None else (os.environ.get(wire.TOKEN_ENV) or None)
        if cfg.host not in LOOPBACK and not self.token:
            raise UserError(f"binding {cfg.host} exposes the simulator to the network: set a token "
                            f"(token=... or {wire.TOKEN_ENV}), or keep host=127.0.0.1")
        self.spec: EnvSpec = simulator.spec
        self._sim_bytes = pickle.dumps(simulator)
        self._expert = self._probe_expert()
        # one batch of the engine per session shard: clients open one session per server for it
        self.batched = isinstance(simulator, BatchedSimulator)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sessions = 0
        self._envs = 0
        self._workers: set[Any] = set()
        self._server: Any = None
        self.port: int | None = None
        self._mp = mp.get_context(cfg.start_method)
        if cfg.start_method == "forkserver":
            self._mp.set_forkserver_preload(["rlinf_cli.runtime.workers", "rlinf_cli.runtime.procs",
                                             type(simulator).__module__])

    def _probe_expert(self) -> bool | str:
        try:
            return self.simulator.expert() is not None
        except Exception as exc:  # e.g. "the experts read the state": said to clients that ask
            return f"{type(exc).__name__}: {exc}" if not isinstance(exc, UserError) else str(exc)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> int:
        # gRPC's C core logs its own copy of bind errors on stderr; ours below is the one line that matters.
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")
        import grpc
        from concurrent import futures

        cfg = self.cfg
        # Memory is bounded by refusing early. gRPC checks a message's length when its 5-byte header
        # arrives and refuses one over max_message_mb (RESOURCE_EXHAUSTED) before buffering it;
        # a handler that checked it would run only after gRPC had held the whole message, and
        # Python a copy (four concurrent 120 MB messages: 66 -> 668 MB). And streams and calls
        # beyond max_streams() are refused at once: see docs/remote.md for the bound.
        options = [("grpc.max_receive_message_length", cfg.max_message_bytes),
                   ("grpc.max_send_message_length", 2 * cfg.max_message_bytes + 2**20),
                   ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.min_ping_interval_without_data_ms", 5000),
                   ("grpc.so_reuseport", 0), *wire.HTTP2_OPTIONS]
        streams = max_streams(cfg)
        self._server = grpc.server(futures.ThreadPoolExecutor(streams, thread_name_prefix="rlinf-env"),
                                   options=options, maximum_concurrent_rpcs=streams)
        handlers = {
            "Info": grpc.unary_unary_rpc_method_handler(self._info),
            "Session": grpc.stream_stream_rpc_method_handler(self._session),
            "Expert": grpc.stream_stream_rpc_method_handler(self._expert_stream),
        }
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(wire.SERVICE, handlers),))
        address = f"{cfg.host}:{cfg.port}" if ":" not in cfg.host else f"[{cfg.host.strip('[]')}]:{cfg.port}"
        try:
            if cfg.tls_cert:
                key_chain = (Path(cfg.tls_key).read_bytes(), Path(cfg.tls_cert).read_bytes())
                port = self._server.add_secure_port(address, grpc.ssl_server_credentials([key_chain]))
            else:
                port = self._server.add_insecure_port(address)
        except (OSError, RuntimeError) as exc:
            why = "the port is in use (another server?) or the address is not on this machine" \
                if "bind" in str(exc).lower() else str(exc)
            raise UserError(f"cannot serve on {address}: {why}") from exc
        if not port:
            raise UserError(f"cannot serve on {address}: the address is in use or not available here")
        self._server.start()
        self.port = port
        log.info("serving %s on %s:%d (%s%s); %d core(s)", self.label, cfg.host, port,
                 "TLS" if cfg.tls_cert else "plaintext", ", token required" if self.token else "", _cores())
        return port

    def wait(self) -> None:
        self._server.wait_for_termination()

    def stop(self, grace: float = 2.0) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
        for w in list(self._workers):
            _kill_quietly(w)

    # -- helpers -----------------------------------------------------------------------------
    def _authorize(self, ctx: Any) -> None:
        import grpc

        if not self.token:
            return
        given = dict(ctx.invocation_metadata()).get(wire.TOKEN_KEY)
        if given is None:
            log.warning("refused %s: no token (this server requires one)", ctx.peer())
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "this env server requires a token")  # the client says how to give one
        if not hmac.compare_digest(str(given).encode(), self.token.encode()):
            log.warning("refused %s: wrong token", ctx.peer())
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong token")

    def _checked(self, ctx: Any, who: str, raw: bytes, check: Any = None) -> Any:
        """A received message, decoded and passed through ``check``; one that is malformed or
        refused by ``check`` (:class:`ProtocolError`) ends the stream. (gRPC refused those over
        the size limit before they got here.)"""
        import grpc

        try:
            try:
                msg = wire.unpack(raw)
            except wire.WireError as exc:
                raise ProtocolError(f"malformed message: {exc}") from None
            return check(msg) if check is not None else msg
        except ProtocolError as exc:
            log.warning("%s: closed the connection: %s", who, exc)
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    # -- RPCs --------------------------------------------------------------------------------
    def _info(self, raw: bytes, ctx: Any) -> bytes:
        self._authorize(ctx)
        self._checked(ctx, f"info call from {ctx.peer()}", raw)
        return wire.pack({"protocol": wire.PROTOCOL, "rlinf": __version__, "simulator": self.label,
                          "spec": self.spec.to_dict(), "cores": _cores(), "expert": self._expert,
                          "normalize_default": getattr(self.simulator, "normalize_default", None) is True,
                          "max_message_bytes": self.cfg.max_message_bytes, "max_envs": self.cfg.max_envs,
                          "batched": self.batched})

    def _session(self, requests: Iterator[bytes], ctx: Any) -> Iterator[bytes]:
        import grpc

        self._authorize(ctx)
        sid = next(self._ids)
        who = f"session {sid} from {ctx.peer()}"
        worker: Any = None
        session: Session | None = None
        reserved = 0
        try:
            first = next(requests, None)
            if first is None:
                return
            session = self._checked(ctx, who, first, lambda msg: Session(msg, self.spec))
            with self._lock:
                if self._sessions >= self.cfg.max_sessions or self._envs + session.num_envs > self.cfg.max_envs:
                    why = (f"server full: {self._sessions} session(s), {self._envs} env(s) open "
                           f"(max_sessions={self.cfg.max_sessions}, max_envs={self.cfg.max_envs})")
                    log.warning("%s: refused: %s", who, why)
                    ctx.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
                self._sessions += 1
                self._envs += session.num_envs
                reserved = session.num_envs
            worker = ProcessWorker(sid, self._mp, self._sim_bytes, session.shards, session.autoreset, session.codec,
                                   None, max(hi for _, hi in session.shards), self.cfg.worker_timeout_s)
            self._workers.add(worker)
            ctx.add_callback(lambda: _kill_quietly(worker))  # stream over (client gone): its worker goes too
            try:
                pid = worker.wait_ready()
            except (RemoteError, WorkerDied) as exc:
                text = exc.args[0] if exc.args else type(exc).__name__
                log.warning("%s: the simulator failed to create envs %s: %s", who, session.shards, last_line(text, "?"))
                yield wire.pack({"error": str(text)})
                return
            log.info("%s: %d env(s) %s in worker pid %d (obs_compression=%s)", who, session.num_envs, session.shards,
                     pid, session.codec.compression)
            yield wire.pack({"ok": {"session": sid, "pid": pid, "envs": session.num_envs}})
            for raw in requests:
                method, args = self._checked(ctx, who, raw, session.check_call)
                if method == "close":
                    yield wire.pack({"ok": None})
                    return
                try:
                    reply = worker.result(worker.submit(method, *args))
                except RemoteError as exc:
                    yield wire.pack({"error": str(exc.args[0] if exc.args else "error")})
                    continue
                except WorkerDied as exc:
                    log.warning("%s: worker died during %s: %s", who, method, exc)
                    yield wire.pack({"died": str(exc)})
                    return
                yield wire.pack({"ok": reply})
        except grpc.RpcError:
            # The stream broke under us: the client went away, or gRPC refused a message over
            # the size limit (it never reached this handler).
            log.warning("%s: stream ended abruptly (client gone, or a message over max_message_mb=%g refused)", who,
                        self.cfg.max_message_mb)
        finally:
            if worker is not None:
                try:
                    worker.close()
                except Exception:
                    _kill_quietly(worker)
                self._workers.discard(worker)
            with self._lock:
                if reserved:
                    self._sessions -= 1
                    self._envs -= reserved
            if session is not None:
                log.info("%s: closed", who)

    def _expert_stream(self, requests: Iterator[bytes], ctx: Any) -> Iterator[bytes]:
        import grpc

        self._authorize(ctx)
        who = f"expert stream from {ctx.peer()}"
        if self._expert is not True:
            why = "this simulator has no scripted expert" if self._expert is False else str(self._expert)
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
        expert = self.simulator.expert()
        try:
            for raw in requests:
                obs, index = self._checked(ctx, who, raw, lambda msg: check_expert_request(msg, self.spec))
                try:
                    action = np.asarray(expert(obs, index))
                except Exception as exc:
                    yield wire.pack({"error": f"{type(exc).__name__}: {exc}"})
                    continue
                yield wire.pack({"ok": action})
        except grpc.RpcError:
            log.warning("%s: stream ended abruptly", who)

def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def make_served_simulator(node: Any) -> tuple[Simulator, str]:
    """The simulator a ``serve`` config names, and its label for logs and clients (``maniskill/PushCube-v1``)."""
    data = dict(plain(node))
    sim = make_simulator(data)
    if getattr(sim, "modality", None) == "text":
        raise UserError(f"'{data['name']}' is a text task: only embodied simulators are served (text tasks need no env server)")
    return sim, str(getattr(sim, "label", None) or f"sim={data['name']}")


def serve_forever(simulator: Simulator, cfg: ServeConfig, label: str) -> None:
    """Run until SIGINT/SIGTERM (used by ``rlinf env serve``)."""
    server = EnvServer(simulator, cfg, label)
    port = server.start()
    print(f"rlinf env server: {label} on {cfg.host}:{port}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    try:
        while not done.wait(1.0):
            pass
    finally:
        log.info("shutting down")
        server.stop()

