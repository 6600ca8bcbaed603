"""``rlinf env serve``: any installed simulator plugin, served over gRPC.

Why gRPC (and not ZeroMQ): a session is a bidirectional stream, so "connection" has a meaning
the server can act on: a client that goes away cancels its stream and the server kills that
session's worker; a token is checked when each stream or call opens; TLS, message size limits
and keepalive are built in. Messages are msgpack (:mod:`rlinf_cli.remote.wire`), never pickle.

Each session hosts one :class:`~rlinf_cli.runtime.workers.EnvWorker` (the client's shards) in a
worker process of its own, started like the local executor's
(:class:`~rlinf_cli.runtime.procs.ProcessWorker`): sessions step in parallel on the server's
cores, and a simulator that crashes takes down its session's process, never the server. The
server's own thread only checks messages and relays them.

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
import os
import pickle
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rlinf_cli.api import EnvSpec, Simulator
from rlinf_cli.errors import UserError
from rlinf_cli.remote import wire
from rlinf_cli.runtime.codec import CODECS, CodecConfig
from rlinf_cli.runtime.workers import RemoteError, WorkerDied, last_line

log = logging.getLogger("rlinf.env")

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
# EnvWorker methods a client may call, and nothing else (``close`` ends the session).
METHODS = ("reset", "step", "park", "ping", "restore")


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"  # address to bind; anything but loopback needs a token
    port: int = 50051  # 0 = any free port (printed at start)
    token: str | None = None  # shared secret; None = $RLINF_ENV_TOKEN, or no token on loopback
    max_message_mb: float = 64.0  # larger messages end the session that sent them
    max_sessions: int = 16  # client sessions at once (each is one worker process)
    max_envs: int = 1024  # envs across all sessions (a robot: 1)
    worker_timeout_s: float = 300.0  # a session's worker silent this long is killed
    start_method: str = "forkserver"  # how session workers start: forkserver | spawn | fork
    tls_cert: str | None = None  # PEM certificate chain: serve TLS (with tls_key)
    tls_key: str | None = None  # PEM private key

    def __post_init__(self) -> None:
        if not valid_host(self.host):
            raise ValueError(f"host={self.host!r} is neither an IP address nor a host name "
                             f"(e.g. host=127.0.0.1, host=0.0.0.0 or host=myhost.local)")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        if self.max_message_mb <= 0 or self.max_sessions < 1 or self.max_envs < 1 or self.worker_timeout_s <= 0:
            raise ValueError("max_message_mb, max_sessions, max_envs and worker_timeout_s must be positive")
        if self.start_method not in ("forkserver", "spawn", "fork"):
            raise ValueError(f"start_method must be forkserver, spawn or fork, got '{self.start_method}'")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both tls_cert and tls_key")

    @property
    def max_message_bytes(self) -> int:
        return int(self.max_message_mb * 2**20)


# streams and calls beyond the sessions: expert streams (one per client process and server) and
# the short Info call each client makes when it starts
EXTRA_STREAMS = 8


def max_streams(cfg: ServeConfig) -> int:
    """How many streams and calls the server holds at once; gRPC refuses more (RESOURCE_EXHAUSTED)."""
    return cfg.max_sessions + EXTRA_STREAMS


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def valid_host(host: str) -> bool:
    """An IP address (v4, or v6 with or without brackets) or a host name (RFC 1123 labels, the
    last not all digits: ``999.1.1.1`` is a bad address, not a name)."""
    import ipaddress

    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
        return True
    except ValueError:
        pass
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    return 0 < len(host) <= 253 and all(_HOST_LABEL.match(label) for label in labels) and not labels[-1].isdigit()


class ProtocolError(Exception):
    """The client broke the protocol (its message is logged and its session ended)."""


def _check_int(x: Any, what: str, lo: int, hi: int) -> int:
    if type(x) is not int or not lo <= x < hi:
        raise ProtocolError(f"{what} must be an integer in [{lo}, {hi}), got {x!r}")
    return x


def check_actions(a: Any, spec: EnvSpec, n: int, what: str = "actions") -> np.ndarray:
    """Actions for ``n`` envs: the spec's dtype and shape, or :class:`ProtocolError`."""
    want = (n, *spec.action.shape)
    if not isinstance(a, np.ndarray) or a.shape != want:
        got = a.shape if isinstance(a, np.ndarray) else type(a).__name__
        raise ProtocolError(f"{what} must be an array of shape {want}, got {got}")
    if spec.discrete:
        if a.dtype.kind not in "iu":
            raise ProtocolError(f"discrete {what} must be integers, got {a.dtype}")
        if a.size and (a.min() < 0 or a.max() >= int(spec.num_actions or 0)):
            raise ProtocolError(f"discrete {what} must lie in [0, {spec.num_actions})")
    elif a.dtype.kind != "f":
        raise ProtocolError(f"continuous {what} must be floating point, got {a.dtype}")
    elif not np.isfinite(a).all():
        raise ProtocolError(f"{what} contain NaN or infinity")
    return a


def check_seeds(seeds: Any, n: int) -> list[int | None]:
    if not isinstance(seeds, list) or len(seeds) != n:
        raise ProtocolError(f"reset needs a list of {n} seeds")
    for s in seeds:
        if s is not None and (type(s) is not int or not 0 <= s < 2**63):
            raise ProtocolError(f"a seed must be a non-negative integer or null, got {s!r}")
    return seeds


class Session:
    """What one client stream asked for: its shards and how to encode observations."""

    def __init__(self, msg: Any, spec: EnvSpec):
        if not isinstance(msg, dict) or msg.get("op") != "open":
            raise ProtocolError("the first message of a session must be {op: open, ...}")
        if msg.get("protocol") != wire.PROTOCOL:
            raise ProtocolError(f"protocol version {msg.get('protocol')!r}; this server speaks {wire.PROTOCOL}")
        shards = msg.get("shards")
        if not isinstance(shards, list) or not 1 <= len(shards) <= 64:
            raise ProtocolError("shards must be a list of 1-64 [lo, hi] pairs")
        self.shards: list[tuple[int, int]] = []
        for pair in shards:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ProtocolError(f"a shard must be [lo, hi], got {pair!r}")
            lo = _check_int(pair[0], "shard start", 0, 2**31)
            hi = _check_int(pair[1], "shard end", lo + 1, 2**31)
            self.shards.append((lo, hi))
        self.num_envs = sum(hi - lo for lo, hi in self.shards)
        codec = msg.get("codec")
        if not (isinstance(codec, list) and len(codec) == 3 and codec[0] in CODECS and isinstance(codec[1], bool)):
            raise ProtocolError("codec must be [compression, delta, level]")
        self.codec = CodecConfig(codec[0], codec[1], _check_int(codec[2], "compression level", -7, 23))
        self.autoreset = msg.get("autoreset")
        if not isinstance(self.autoreset, bool):
            raise ProtocolError("autoreset must be true or false")
        self.spec = spec

    def check_call(self, msg: Any) -> tuple[str, tuple]:
        """``(method, args)`` of a call message, every argument checked against the spec
        (``("close", ())`` for a close message)."""
        if isinstance(msg, dict) and msg.get("op") == "close":
            return "close", ()
        if not isinstance(msg, dict) or msg.get("op") != "call":
            raise ProtocolError("expected {op: call, method, args} or {op: close}")
        method, args = msg.get("method"), msg.get("args")
        if method not in METHODS or not isinstance(args, list):
            raise ProtocolError(f"unknown method {method!r}; allowed: {', '.join(METHODS)}")
        if method == "ping":
            if args:
                raise ProtocolError("ping takes no arguments")
            return method, ()
        if not args:
            raise ProtocolError(f"{method} needs a shard index")
        i = _check_int(args[0], "shard index", 0, len(self.shards))
        lo, hi = self.shards[i]
        n = hi - lo
        if method == "park" and len(args) == 1:
            return method, (i,)
        if method == "reset" and len(args) == 2:
            return method, (i, check_seeds(args[1], n))
        if method == "step" and len(args) == 2:
            return method, (i, check_actions(args[1], self.spec, n))
        if method == "restore" and len(args) == 4:  # (shard, seed streams, episode indices, actions to replay)
            streams = check_seeds(args[1], n)
            episodes = args[2]
            if not isinstance(episodes, list) or len(episodes) != n or \
                    not all(type(k) is int and 0 <= k < 2**62 for k in episodes):
                raise ProtocolError(f"restore needs {n} non-negative episode indices")
            actions = args[3]
            if actions is not None:
                if not isinstance(actions, list) or len(actions) != n:
                    raise ProtocolError(f"restore needs {n} action arrays (or null)")
                for a in actions:
                    if not isinstance(a, np.ndarray) or a.ndim < 1:
                        raise ProtocolError("restore's actions must be arrays [L, *action_shape]")
                    check_actions(a, self.spec, a.shape[0], "restore actions")
            return method, (i, streams, episodes, actions)
        raise ProtocolError(f"bad arguments for {method}")


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
        from rlinf_cli.api import BatchedSimulator

        # one batch of the engine per session shard: clients open one session per server for it
        self.batched = isinstance(simulator, BatchedSimulator)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._sessions = 0
        self._envs = 0
        self._workers: set[Any] = set()
        self._server: Any = None
        self.port: int | None = None
        import multiprocessing as mp

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
        from rlinf_cli import __version__

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
            from rlinf_cli.runtime.procs import ProcessWorker

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
                obs, index = self._checked(ctx, who, raw, self._check_expert_request)
                try:
                    action = np.asarray(expert(obs, index))
                except Exception as exc:
                    yield wire.pack({"error": f"{type(exc).__name__}: {exc}"})
                    continue
                yield wire.pack({"ok": action})
        except grpc.RpcError:
            log.warning("%s: stream ended abruptly", who)

    def _check_expert_request(self, msg: Any) -> tuple[dict[str, np.ndarray], int]:
        if not isinstance(msg, dict) or not isinstance(msg.get("obs"), dict):
            raise ProtocolError("an expert request is {obs: {...}, index: int}")
        index = _check_int(msg.get("index"), "env index", 0, 2**31)
        obs = msg["obs"]
        for key, arr in obs.items():
            s = self.spec.observation.get(key)
            if s is None or not isinstance(arr, np.ndarray) or arr.shape != tuple(s.shape):
                raise ProtocolError(f"observation '{key}' does not match the spec")
        return obs, index


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def make_served_simulator(node: Any) -> tuple[Simulator, str]:
    """The simulator a ``serve`` config names, and its label for logs and clients (``maniskill/PushCube-v1``)."""
    from rlinf_cli.registry import make_simulator
    from rlinf_cli.settings import plain

    data = dict(plain(node))
    sim = make_simulator(data)
    if getattr(sim, "modality", None) == "text":
        raise UserError(f"'{data['name']}' is a text task: only embodied simulators are served (text tasks need no env server)")
    return sim, str(getattr(sim, "label", None) or f"sim={data['name']}")


def serve_forever(simulator: Simulator, cfg: ServeConfig, label: str) -> None:
    """Run until SIGINT/SIGTERM (used by ``rlinf env serve``)."""
    import signal

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

