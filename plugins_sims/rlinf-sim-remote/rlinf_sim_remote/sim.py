"""``sim=remote``: a simulator whose envs live on one or more ``rlinf env serve`` servers.

At construction it asks every server what it serves (the spec must be the same on all), so
stages see an ordinary :class:`~rlinf_cli.api.Simulator`. It is a
:class:`~rlinf_cli.api.HostedSimulator`: executors open sessions on the servers instead of
starting env workers (:func:`~rlinf_cli.runtime.hosting.hosted_vec_env`). ``make_env`` gives one
remote env (``rlinf check-sim sim=remote``), and ``expert()`` the server's scripted expert.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rlinf_cli.api import settings, EnvSpec, UserError


@dataclass(frozen=True)
class RemoteConfig:
    address: str | tuple[str, ...] = "127.0.0.1:50051"  # host:port, or several to spread envs over servers
    token: str | None = None  # None = $RLINF_ENV_TOKEN
    tls: bool = False
    tls_ca: str | None = None
    tls_server_name: str | None = None
    sessions_per_server: int = 0  # 0 = one per server core
    connect_timeout_s: float = 20.0
    reconnect_s: float = 10.0
    request_timeout_s: float = 300.0
    max_message_mb: float = 64.0

    def __post_init__(self) -> None:
        for a in self.addresses:
            host, sep, port = a.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"address must be host:port, got {a!r}")
        if self.sessions_per_server < 0 or self.connect_timeout_s <= 0 or self.reconnect_s < 0 or self.max_message_mb <= 0:
            raise ValueError("sessions_per_server, connect_timeout_s, reconnect_s and max_message_mb must not be negative")

    @property
    def addresses(self) -> tuple[str, ...]:
        if isinstance(self.address, str):
            return tuple(a.strip() for a in self.address.split(",") if a.strip())
        return tuple(self.address)


class RemoteSimulator:
    def __init__(self, cfg: Mapping[str, Any]):
        from rlinf_cli.api import wire, Endpoint, server_info

        self.cfg = settings.build(RemoteConfig, cfg, "sim")
        if not self.cfg.addresses:
            raise UserError("sim.address is empty: give host:port of an `rlinf env serve` server")
        token = self.cfg.token if self.cfg.token is not None else (os.environ.get(wire.TOKEN_ENV) or None)
        self.endpoints = [Endpoint(a, token, self.cfg.tls, self.cfg.tls_ca, self.cfg.tls_server_name,
                                   int(self.cfg.max_message_mb * 2**20), self.cfg.connect_timeout_s)
                          for a in self.cfg.addresses]
        self.servers = [server_info(ep) for ep in self.endpoints]
        specs = [EnvSpec.from_dict(info["spec"]) for info in self.servers]
        for ep, spec in zip(self.endpoints[1:], specs[1:]):
            if spec != specs[0]:
                raise UserError(f"env servers serve different simulators: {self.endpoints[0].address} "
                                f"({self.servers[0].get('simulator')}) and {ep.address}: give addresses of one simulator")
        self.spec = specs[0]
        # the served simulator's recommendation for env.normalize_*=auto (older servers: none)
        self.normalize_default = self.servers[0].get("normalize_default") is True

    # -- Simulator ---------------------------------------------------------------------------
    def make_env(self, index: int) -> Any:
        from rlinf_cli.api import RemoteEnv

        ep = self.endpoints[index % len(self.endpoints)]
        return RemoteEnv(ep, index, self.spec.has_success, self.cfg.request_timeout_s)

    def expert(self) -> Any:
        from rlinf_cli.api import RemoteExpert

        have = self.servers[0].get("expert")
        if have is True:
            return RemoteExpert(self.endpoints, self.cfg.request_timeout_s)
        if have is False:
            return None
        raise UserError(f"the served simulator's expert is not usable: {have}")

    # -- HostedSimulator ---------------------------------------------------------------------
    @property
    def batched(self) -> bool:
        """The served simulator steps its envs as one batch (Isaac Lab): one session per server
        holds them all, and each batched step is one request."""
        return bool(self.servers[0].get("batched", False))

    def default_workers(self, num_envs: int) -> int:
        if self.cfg.sessions_per_server:
            return self.cfg.sessions_per_server * len(self.endpoints)
        if self.batched:
            return len(self.endpoints)
        return sum(max(1, int(info.get("cores", 1))) for info in self.servers)

    def connect_workers(self, shard_lists: Sequence[Sequence[tuple[int, int]]], autoreset: bool, codec: Any,
                        timeout_s: float) -> list[Any]:
        from rlinf_cli.api import open_workers

        return open_workers(self.endpoints, shard_lists, autoreset, codec, timeout_s, self.cfg.reconnect_s)

    def describe(self) -> str:
        where = ", ".join(ep.address for ep in self.endpoints)
        sims = sorted({str(info.get("simulator")) for info in self.servers})
        return f"{len(self.endpoints)} env server(s) {where} ({', '.join(sims)})"
