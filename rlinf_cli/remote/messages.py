"""What an env server accepts: its settings, and every client message checked before it reaches a worker.

The gRPC life cycle (binding, streams, worker processes) is :mod:`rlinf_cli.remote.server`; this
module is the other half: pure checks with no gRPC, no processes. A message that breaks the
protocol raises :class:`ProtocolError`, which ends that client's session with a logged reason
and never reaches the simulator (docs/remote.md).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinf_cli.api import EnvSpec
from rlinf_cli.remote import wire
from rlinf_cli.runtime.codec import CODECS, CodecConfig

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
    """Reset seeds for ``n`` envs: a list of non-negative integers or nulls, or :class:`ProtocolError`."""
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


def check_expert_request(msg: Any, spec: EnvSpec) -> tuple[dict[str, np.ndarray], int]:
    """``(obs, env index)`` of an expert request, every observation checked against ``spec``."""
    if not isinstance(msg, dict) or not isinstance(msg.get("obs"), dict):
        raise ProtocolError("an expert request is {obs: {...}, index: int}")
    index = _check_int(msg.get("index"), "env index", 0, 2**31)
    obs = msg["obs"]
    for key, arr in obs.items():
        s = spec.observation.get(key)
        if s is None or not isinstance(arr, np.ndarray) or arr.shape != tuple(s.shape):
            raise ProtocolError(f"observation '{key}' does not match the spec")
    return obs, index
