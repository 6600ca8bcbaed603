"""The client side of ``rlinf env serve``: sessions as worker handles, one remote env, the expert.

:class:`RemoteWorker` is a :class:`~rlinf_cli.runtime.workers.WorkerHandle`: the driver's
:class:`~rlinf_cli.runtime.workers.WorkerVecEnv` steps a server's envs exactly as it steps local
worker processes or Ray actors, with the same pipelining (hybrid mode), observation decoding and
crash recovery. Faults map onto that policy:

- the server answers that the session's worker died, or no reply comes within
  ``runtime.worker_timeout_s`` (server hung): :class:`~rlinf_cli.runtime.workers.WorkerDied`;
  the stream breaks (server killed or restarted, network gone):
  :class:`~rlinf_cli.runtime.workers.ConnectionLost`, which does not use up
  ``runtime.max_restarts``. The vec env then calls :meth:`restart`, which opens a new session
  (retrying for ``reconnect_s``); the interrupted episodes count as truncated. If the server
  stays unreachable, the run stops with one clear error line.
- the token is refused, or the server is unreachable when the run starts: a
  :class:`~rlinf_cli.errors.UserError` (one line, exit code 2).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rlinf_cli.api import Obs
from rlinf_cli.errors import UserError
from rlinf_cli.remote import wire
from rlinf_cli.runtime.codec import CodecConfig, ObsDecoder
from rlinf_cli.runtime.env_worker import Reply
from rlinf_cli.runtime.workers import ConnectionLost, RemoteError, WorkerDied, last_line, start_all

_END = object()


@dataclass(frozen=True)
class Endpoint:
    """How to reach one env server."""

    address: str  # host:port
    token: str | None = None
    tls: bool = False
    tls_ca: str | None = None  # PEM file of the CA (or self-signed certificate); None = system roots
    tls_server_name: str | None = None  # the name in the server's certificate, when it differs from the host
    max_message_bytes: int = 64 * 2**20
    connect_timeout_s: float = 20.0

    def channel(self) -> Any:
        import grpc

        limit = 2 * self.max_message_bytes + 2**20
        options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                   ("grpc.keepalive_time_ms", 20000), ("grpc.keepalive_timeout_ms", 10000),
                   ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 2000),
                   ("grpc.enable_retries", 0), *wire.HTTP2_OPTIONS]
        if not self.tls:
            return grpc.insecure_channel(self.address, options=options)
        try:
            roots = Path(self.tls_ca).read_bytes() if self.tls_ca else None
        except OSError as exc:
            raise UserError(f"sim.tls_ca: cannot read {self.tls_ca}: {exc.strerror}") from exc
        if self.tls_server_name:
            options.append(("grpc.ssl_target_name_override", self.tls_server_name))
        return grpc.secure_channel(self.address, grpc.ssl_channel_credentials(root_certificates=roots), options=options)

    def metadata(self) -> list[tuple[str, str]]:
        return [(wire.TOKEN_KEY, self.token)] if self.token else []


def _user_error(ep: Endpoint, exc: Any) -> UserError | None:
    """The RPC errors that are the user's to fix (token, address, capacity), as one line."""
    import grpc

    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return UserError(f"env server {ep.address} refused the connection: {details}. Set sim.token "
                         f"(or {wire.TOKEN_ENV}) to the token the server was started with")
    status = grpc.StatusCode
    said = {status.RESOURCE_EXHAUSTED: " refused the session:", status.INVALID_ARGUMENT: " rejected a request:",
            status.FAILED_PRECONDITION: ":"}.get(code)
    return None if said is None else UserError(f"env server {ep.address}{said} {details}")


def server_info(ep: Endpoint) -> dict[str, Any]:
    """What the server serves (spec, expert, cores); a clear error if it cannot be asked."""
    import grpc

    ch = ep.channel()
    try:
        call = ch.unary_unary(wire.INFO)
        raw = call(wire.pack({"protocol": wire.PROTOCOL}), metadata=ep.metadata(), timeout=ep.connect_timeout_s,
                   wait_for_ready=True)
    except grpc.RpcError as exc:
        known = _user_error(ep, exc)
        if known is not None:
            raise known from None
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise UserError(f"no env server answered at {ep.address} within {ep.connect_timeout_s:g} s "
                            f"(sim.connect_timeout_s): is `rlinf env serve` running there"
                            + (" with TLS?" if ep.tls else "? (if it serves TLS, set sim.tls=true)")) from None
        raise UserError(f"env server {ep.address}: {exc.code().name}: {exc.details()}") from None
    finally:
        ch.close()
    info = wire.unpack(raw)
    if not isinstance(info, dict) or info.get("protocol") != wire.PROTOCOL:
        raise UserError(f"env server {ep.address} speaks protocol {info.get('protocol') if isinstance(info, dict) else '?'}; "
                        f"this client speaks {wire.PROTOCOL}: install the same rlinf version on both sides")
    return info


class _Stream:
    """One bidirectional gRPC stream: ``send`` messages, ``recv`` replies with a timeout.

    ``reconnect_s``: how long its owner retries a broken stream (said by :class:`ConnectionLost`).
    """

    def __init__(self, ep: Endpoint, method: str, reconnect_s: float = 0.0):
        self.ep = ep
        self.reconnect_s = reconnect_s
        self._channel = ep.channel()
        self._out: queue.Queue = queue.Queue()
        self._in: queue.Queue = queue.Queue()
        # requests: what send() queued, until close() queues _END
        self._call = self._channel.stream_stream(method)(iter(self._out.get, _END), metadata=ep.metadata())
        self._reader = threading.Thread(target=self._read, daemon=True, name="rlinf-env-client")
        self._reader.start()
        self.closed = False

    def _read(self) -> None:
        try:
            for raw in self._call:
                self._in.put(raw)
            self._in.put(_END)
        except Exception as exc:  # grpc.RpcError: the stream broke; recv() reports it
            self._in.put(exc)

    def send(self, obj: Any) -> None:
        self._out.put(wire.pack(obj))

    def recv(self, timeout: float) -> Any:
        """The next reply; raises :class:`ConnectionLost` (stream over), :class:`WorkerDied`
        (silent, or a malformed reply) or :class:`UserError`."""
        try:
            item = self._in.get(timeout=timeout)
        except queue.Empty:
            raise WorkerDied(f"no reply from {self.ep.address} in {timeout:g} s (runtime.worker_timeout_s)") from None
        if item is _END:
            self._in.put(_END)
            raise ConnectionLost(f"env server {self.ep.address} ended the session", self.ep.address, self.reconnect_s)
        if isinstance(item, Exception):
            self._in.put(item)
            known = _user_error(self.ep, item) if hasattr(item, "code") else None
            if known is not None:
                raise known
            code = item.code().name if hasattr(item, "code") else type(item).__name__
            details = item.details() if hasattr(item, "details") else str(item)
            raise ConnectionLost(f"lost env server {self.ep.address} ({code}: {details})", self.ep.address,
                                 self.reconnect_s)
        try:
            return wire.unpack(item)
        except wire.WireError as exc:
            raise WorkerDied(f"env server {self.ep.address} sent a malformed reply: {exc}") from None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._out.put(_END)
        self._call.cancel()
        self._channel.close()


class RemoteWorker:
    """A :class:`~rlinf_cli.runtime.workers.WorkerHandle` for one session on an env server."""

    def __init__(self, ep: Endpoint, index: int, shards: Sequence[tuple[int, int]], autoreset: bool,
                 codec: CodecConfig, timeout_s: float, reconnect_s: float = 10.0):
        self.ep = ep
        self.index = index
        self._open_msg = {"op": "open", "protocol": wire.PROTOCOL, "shards": [[int(lo), int(hi)] for lo, hi in shards],
                          "autoreset": bool(autoreset), "codec": [codec.compression, bool(codec.delta), int(codec.level)]}
        self.timeout_s = timeout_s
        self.reconnect_s = reconnect_s
        self.generation = 0
        self.session: dict[str, Any] = {}
        self._stream: _Stream | None = None
        self.start()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Open a session (does not wait for its envs: see :meth:`wait_ready`)."""
        self._stream = _Stream(self.ep, wire.SESSION, self.reconnect_s)
        self._stream.send(self._open_msg)
        self.generation += 1
        self._sent = 0
        self._received = 0
        self._buffer: dict[int, Any] = {}

    def wait_ready(self) -> dict[str, Any]:
        """Block until the server built the session's envs (the simulator's error as :class:`RemoteError`)."""
        self.session = self.result((self.generation, -1))
        return self.session

    def restart(self) -> None:
        self.kill()
        deadline = time.monotonic() + self.reconnect_s
        while True:
            try:
                self.start()
                self.wait_ready()
                return
            except WorkerDied as exc:
                self.kill()
                if time.monotonic() >= deadline:
                    raise ConnectionLost(str(exc), self.ep.address, self.reconnect_s) from None
                time.sleep(0.5)

    def kill(self) -> None:
        if self._stream is not None:
            self._stream.close()

    def close(self) -> None:
        stream = self._stream
        if stream is None or stream.closed:
            return
        try:
            stream.send({"op": "close"})
            deadline = time.monotonic() + 5
            while self._received < self._sent + 2 and time.monotonic() < deadline:  # open + calls + close replies
                stream.recv(max(deadline - time.monotonic(), 0.01))
                self._received += 1
        except Exception:  # closing must not mask the error that made us close
            pass
        finally:
            stream.close()

    def describe(self) -> str:
        return f"session {self.session.get('session', '?')} on {self.ep.address} (server worker pid {self.session.get('pid', '?')})"

    # -- requests ----------------------------------------------------------------------------
    def submit(self, method: str, *args: Any) -> tuple[int, int]:
        ticket = (self.generation, self._sent)
        self._sent += 1
        if self._stream is not None and not self._stream.closed:
            self._stream.send({"op": "call", "method": method, "args": list(args)})
        return ticket

    def result(self, ticket: tuple[int, int]) -> Any:
        gen, seq = ticket
        if gen != self.generation:
            raise WorkerDied("the session was reopened since this request")
        slot = seq + 1  # slot 0 is the reply to the session's open message
        deadline = time.monotonic() + self.timeout_s
        while slot not in self._buffer:
            if self._stream is None or self._stream.closed:
                raise WorkerDied(f"the session on {self.ep.address} is closed")
            self._buffer[self._received] = self._stream.recv(max(deadline - time.monotonic(), 0.001))
            self._received += 1
        msg = self._buffer.pop(slot)
        if not isinstance(msg, dict):
            raise WorkerDied(f"env server {self.ep.address} sent a reply outside the protocol")
        if "ok" in msg:
            return msg["ok"]
        if "error" in msg:
            raise RemoteError(msg["error"])
        raise WorkerDied(f"on env server {self.ep.address}: {msg.get('died', 'unknown failure')}")


def open_workers(endpoints: Sequence[Endpoint], shard_lists: Sequence[Sequence[tuple[int, int]]], autoreset: bool,
                 codec: CodecConfig, timeout_s: float, reconnect_s: float) -> list[RemoteWorker]:
    """One session per shard list, spread round-robin over the servers; opened in parallel."""
    return start_all(lambda w: RemoteWorker(endpoints[w % len(endpoints)], w, shard_lists[w], autoreset, codec,
                                            timeout_s, reconnect_s), len(shard_lists))


class RemoteEnv:
    """One env on an env server, as a :class:`~rlinf_cli.api.SingleEnv` (``check-sim``, or an
    executor that builds envs one by one)."""

    def __init__(self, ep: Endpoint, index: int, has_success: bool, timeout_s: float):
        self._worker = RemoteWorker(ep, index, [(index, index + 1)], False, CodecConfig(), timeout_s, 0.0)
        self._decoder = ObsDecoder(CodecConfig())
        self._has_success = has_success
        try:
            self._worker.wait_ready()
        except BaseException:
            self._worker.kill()
            raise

    def _call(self, method: str, *args: Any) -> Reply:
        try:
            return self._worker.result(self._worker.submit(method, *args))
        except RemoteError as exc:
            raise RuntimeError(f"on the env server: {last_line(exc.args[0] if exc.args else '', 'error')}") from None

    def _obs(self, reply: Reply) -> Obs:
        obs, _ = self._decoder.decode(reply.obs)
        return {k: v[0] for k, v in obs.items()}

    def reset(self, *, seed: int | None = None) -> tuple[Obs, dict]:
        reply = self._call("reset", 0, [None if seed is None else int(seed)])
        return self._obs(reply), {}

    def step(self, action: Any) -> tuple[Obs, float, bool, bool, dict]:
        reply = self._call("step", 0, np.asarray(action)[None])
        info = {"success": bool(reply.success[0])} if self._has_success else {}
        return self._obs(reply), float(reply.reward[0]), bool(reply.terminated[0]), bool(reply.truncated[0]), info

    def close(self) -> None:
        self._worker.close()


class RemoteExpert:
    """The server simulator's scripted expert: ``(obs of one env, env index) -> action``."""

    def __init__(self, endpoints: Sequence[Endpoint], timeout_s: float):
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self._streams: dict[int, _Stream] = {}

    def __getstate__(self) -> dict[str, Any]:  # streams do not travel; they reopen where the expert is used
        return {"endpoints": self.endpoints, "timeout_s": self.timeout_s, "_streams": {}}

    def __call__(self, obs: Obs, index: int) -> np.ndarray:
        k = int(index) % len(self.endpoints)
        stream = self._streams.get(k)
        if stream is None:
            stream = self._streams[k] = _Stream(self.endpoints[k], wire.EXPERT)
        stream.send({"obs": {key: np.asarray(v) for key, v in obs.items()}, "index": int(index)})
        try:
            msg = stream.recv(self.timeout_s)
        except WorkerDied as exc:
            stream.close()
            del self._streams[k]
            raise RuntimeError(f"remote expert: {exc}") from None
        if "error" in msg:
            raise RuntimeError(f"remote expert on {self.endpoints[k].address}: {msg['error']}")
        return msg["ok"]

    def close(self) -> None:
        for s in self._streams.values():
            s.close()
        self._streams.clear()

