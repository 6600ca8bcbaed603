"""The env server (`rlinf env serve`) and `sim=remote`: same results as local workers, the
simulator contract through the wire, tokens, faults, malformed messages. Loopback only."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from envserver import env_server, free_port
from fake_sims import CounterSim
from rlinf_cli.errors import UserError
from rlinf_cli.remote import wire
from rlinf_cli.remote.server import EnvServer, ServeConfig
from rlinf_cli.runtime.codec import Packed
from rlinf_cli.runtime.env_worker import Reply
from rlinf_cli.runtime.workers import EnvWorkerError
from rlinf_executor_local.executor import LocalExecutor
from rlinf_sim_remote.sim import RemoteSimulator
from tests.unit.test_runtime_workers import _assert_same, _trace

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def serving(sim, **cfg):
    """An env server in this process (its sessions' workers are processes); yields its address."""
    server = EnvServer(sim, ServeConfig(port=0, **cfg), "test")
    port = server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=0)


@contextlib.contextmanager
def server_process(port: int, *args: str, env: dict | None = None):
    """`rlinf env serve` of CartPole as a subprocess on ``port`` (for kill -9 / SIGSTOP)."""
    with env_server([sys.executable, "-m", "rlinf_cli"], "sim=gymnasium", "sim.env_id=CartPole-v1", *args,
                    port=port, env=env) as (proc, _):
        yield proc


def _local(mode: str, **runtime) -> LocalExecutor:
    return LocalExecutor({"name": "local", "runtime": {"mode": mode, "env_workers": 2, **runtime}})


def _cartpole():
    from rlinf_sim_gymnasium.sim import GymnasiumSimulator

    return GymnasiumSimulator({"env_id": "CartPole-v1"})


# -- the wire --------------------------------------------------------------------------------
def test_wire_round_trips_arrays_packed_obs_and_replies() -> None:
    reply = Reply({"rgb": Packed((2, 4, 4, 3), "|u1", True, b"\x01\x02")}, np.arange(2, dtype=np.float32),
                  np.array([True, False]), np.zeros(2, bool), np.ones(2, bool), {"state": np.eye(2)}, {"x": 1.5})
    back = wire.unpack(wire.pack({"ok": reply, "t": (1, "a"), "n": np.int64(3)}))
    got = back["ok"]
    assert isinstance(got, Reply) and got.obs["rgb"] == reply.obs["rgb"] and got.stats == {"x": 1.5}
    np.testing.assert_array_equal(got.reward, reply.reward)
    np.testing.assert_array_equal(got.final_obs["state"], np.eye(2))
    assert got.terminated.dtype == bool and back["t"] == (1, "a") and back["n"] == 3


def test_wire_refuses_what_it_cannot_check() -> None:
    import msgpack

    with pytest.raises(TypeError):
        wire.pack({"x": np.array([object()])})
    with pytest.raises(TypeError):  # no pickle-able objects on the wire
        wire.pack({"x": {1, 2}})
    bad = [
        b"\xc1\xff\x00",  # not msgpack
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["|O", [1], b"12345678"]))),  # object dtype
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["<f4", [3], b"1234"]))),  # bytes do not match the shape
        msgpack.packb(msgpack.ExtType(1, msgpack.packb(["<f4", [-1], b""]))),  # negative dimension
        msgpack.packb(msgpack.ExtType(9, b"")),  # unknown extension
        msgpack.packb({1: 2}),  # non-string keys
    ]
    for data in bad:
        with pytest.raises(wire.WireError):
            wire.unpack(data)


# -- same results as local workers; every executor and mode ---------------------------------
@pytest.mark.parametrize("mode,extra", [("disaggregated", {}), ("hybrid", {"obs_compression": "lz4", "obs_delta": True}),
                                        ("collocated", {"obs_compression": "zstd"})])
@pytest.mark.parametrize("autoreset", [True, False])
def test_remote_envs_match_local_ones(mode: str, extra: dict, autoreset: bool) -> None:
    sim = CounterSim(horizon=4, image=True)
    ref = _local("collocated").make_vec_env(sim, 5, autoreset)
    with serving(sim) as address:
        remote = RemoteSimulator({"address": address})
        assert remote.spec == sim.spec
        env = _local(mode, **extra).make_vec_env(remote, 5, autoreset)
        try:
            assert "session(s) on 1 env server(s)" in env.label
            _assert_same(_trace(ref), _trace(env))
            _assert_same(_trace(ref, seed0=99), _trace(env, seed0=99))
        finally:
            env.close()
            ref.close()


def test_restore_replays_on_the_server_like_locally() -> None:
    """Exact resume through the wire: the server resets each env into its episode and replays the actions."""
    sim = CounterSim(horizon=10)
    actions = [np.array([1, 2, 0], np.int64), np.zeros(0, np.int64), np.array([2], np.int64)]
    ref = _local("collocated").make_vec_env(sim, 3, True)
    with serving(sim) as address:
        env = _local("hybrid").make_vec_env(RemoteSimulator({"address": address}), 3, True)
        try:
            want = ref.restore([11, 12, 13], [0, 2, 5], actions)
            got = env.restore([11, 12, 13], [0, 2, 5], actions)
            _assert_same(want, got)
            assert got["state"][:, 2].tolist() == [3.0, 0.0, 1.0]  # steps replayed per env
            a = np.ones(3, np.int64)
            _assert_same(ref.step(a).obs, env.step(a).obs)
        finally:
            env.close()
            ref.close()


def test_ray_executor_and_several_servers() -> None:
    from rlinf_executor_ray.executor import RayExecutor

    sim = CounterSim(horizon=3)
    ref = _local("collocated").make_vec_env(sim, 6, True)
    with serving(sim) as a, serving(sim) as b:
        remote = RemoteSimulator({"address": [a, b], "sessions_per_server": 2})
        env = RayExecutor({"name": "ray", "runtime": {"mode": "hybrid", "pipeline_stages": 2}}).make_vec_env(remote, 6, True)
        try:
            assert len(env.handles) == 4 and {h.ep.address for h in env.handles} == {a, b}
            _assert_same(_trace(ref), _trace(env))
        finally:
            env.close()
            ref.close()


def test_auto_mode_does_not_probe_a_remote_simulator() -> None:
    sim = CounterSim()
    with serving(sim) as address:
        ex = _local("auto")
        env = ex.make_vec_env(RemoteSimulator({"address": address}), 4, True)
        env.close()
    assert ex.choice is not None and "env server" in ex.choice.reason


# -- the contract and the CLI through the wire -----------------------------------------------
def test_the_served_simulators_normalization_default_travels() -> None:
    """env.normalize_*=auto decides on the client from the served simulator's recommendation."""
    from rlinf_sim_gymnasium.sim import GymnasiumSimulator

    for sim, want in ((GymnasiumSimulator({"env_id": "Pendulum-v1"}), True), (_cartpole(), False), (CounterSim(), False)):
        with serving(sim) as address:
            assert RemoteSimulator({"address": address}).normalize_default is want


def test_check_sim_through_the_wire(cli) -> None:
    with serving(_cartpole()) as address:
        res = cli("check-sim", "sim=remote", f"sim.address={address}")
    assert res.code == 0, res.err
    assert "FAIL" not in res.out and res.out.count("| pass") + res.out.count("│ pass") == 8  # the expert too


def test_rl_through_the_wire_resumes_exactly_and_overlaps(cli, workdir) -> None:
    """`rlinf rl sim=remote`: a resumed run equals the uninterrupted one (the server replays the
    in-flight episodes), and overlapped rollouts open sessions (not one remote env per instance)."""
    import json

    common = ["--algo", "ppo", "algo.rollout_steps=32", "num_envs=4", "eval.episodes=2", "tracking.enabled=false",
              "progress=false", "checkpoint.interval=1", "checkpoint.keep=10"]
    with serving(_cartpole(), max_sessions=4) as address:
        remote = ["sim=remote", f"sim.address={address}", "sim.sessions_per_server=2"]
        full = cli("rl", *remote, *common, "total_steps=384", "run_dir=full")
        assert full.code == 0, full.err
        part = cli("rl", *remote, *common, "total_steps=384", "run_dir=part", "resume=full/checkpoints/iter_000001")
        assert part.code == 0, part.err
        over = cli("rl", *remote, *common, "total_steps=256", "run_dir=over", "runtime.overlap_update=true")
        assert over.code == 0, over.err
    def last_update(run: str) -> dict:
        rows = [json.loads(x) for x in (workdir / run / "metrics.jsonl").read_text().splitlines()]
        return [r for r in rows if "train/policy_loss" in r][-1]

    a, b = last_update("full"), last_update("part")
    assert a["step"] == b["step"] == 384
    for key in ("train/policy_loss", "train/value_loss", "train/approx_kl"):
        assert a[key] == b[key], key


def test_token_missing_or_wrong_is_one_line_and_exit_2(cli, monkeypatch) -> None:
    monkeypatch.delenv(wire.TOKEN_ENV, raising=False)
    with serving(_cartpole(), token="s3cret") as address:
        missing = cli("check-sim", "sim=remote", f"sim.address={address}")
        wrong = cli("check-sim", "sim=remote", f"sim.address={address}", "sim.token=guess")
        monkeypatch.setenv(wire.TOKEN_ENV, "s3cret")
        good = cli("check-sim", "sim=remote", f"sim.address={address}")
    for res, why in ((missing, "requires a token"), (wrong, "wrong token")):
        assert res.code == 2
        assert res.err.startswith("error: env server 127.0.0.1:") and why in res.err, res.err
        assert res.err.count("\n") == 1 and "Traceback" not in res.err
        assert res.err.count(wire.TOKEN_ENV) == 1  # how to give a token is said once
    assert good.code == 0, good.err


def test_binding_beyond_loopback_needs_a_token(cli, monkeypatch) -> None:
    monkeypatch.delenv(wire.TOKEN_ENV, raising=False)
    with pytest.raises(UserError, match="set a token"):
        EnvServer(CounterSim(), ServeConfig(host="0.0.0.0"))
    EnvServer(CounterSim(), ServeConfig(host="0.0.0.0", token="t"))  # allowed (not started: loopback-only tests)
    res = cli("env", "serve", "sim=gymnasium", "host=0.0.0.0", "port=0")
    assert res.code == 2 and "set a token" in res.err
    with serving(CounterSim()) as address:  # a port already taken: one line, exit 2
        res = cli("env", "serve", "sim=gymnasium", f"port={address.rsplit(':', 1)[1]}")
    assert res.code == 2 and res.err == f"error: cannot serve on {address}: the port is in use (another server?) or " \
        "the address is not on this machine\n"


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for localhost/127.0.0.1 and its key (PEM), made here."""
    import datetime
    import ipaddress

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_with_a_token(cli, tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(wire.TOKEN_ENV, raising=False)
    cert, key = _self_signed(tmp_path)
    with serving(CounterSim(), tls_cert=str(cert), tls_key=str(key), token="t0k") as address:
        good = cli("check-sim", "sim=remote", f"sim.address={address}", "sim.tls=true", f"sim.tls_ca={cert}",
                   "sim.token=t0k")
        plain = cli("check-sim", "sim=remote", f"sim.address={address}", "sim.token=t0k", "sim.connect_timeout_s=2")
    assert good.code == 0, good.err
    assert plain.code == 2 and "sim.tls=true" in plain.err and plain.err.count("\n") == 1


def test_no_server_is_a_clear_error(cli) -> None:
    res = cli("check-sim", "sim=remote", f"sim.address=127.0.0.1:{free_port()}", "sim.connect_timeout_s=1")
    assert res.code == 2 and "no env server answered" in res.err and res.err.count("\n") == 1


# -- faults ------------------------------------------------------------------------------------
def _remote_env(port: int, n: int = 4, reconnect_s: float = 2.0, timeout_s: float = 30.0, restarts: int = 3):
    remote = RemoteSimulator({"address": f"127.0.0.1:{port}", "reconnect_s": reconnect_s, "sessions_per_server": 2})
    return _local("disaggregated", worker_timeout_s=timeout_s, max_restarts=restarts).make_vec_env(remote, n, True)


def test_server_killed_mid_run_is_a_clear_error(capsys) -> None:
    """A server gone for longer than sim.reconnect_s: the error says which server, for how long,
    and what to do (not "check the simulator": issue 31)."""
    port = free_port()
    with server_process(port) as proc:
        env = _remote_env(port)
        try:
            env.reset([0, 1, 2, 3])
            env.step(np.zeros(4, dtype=np.int64))
            proc.kill()
            proc.wait()
            t0 = time.monotonic()
            with pytest.raises(EnvWorkerError) as err:
                env.step(np.zeros(4, dtype=np.int64))
            assert time.monotonic() - t0 < 15
        finally:
            env.close()
    msg = str(err.value)
    assert msg.startswith(f"env server 127.0.0.1:{port} was lost during step (lost env server 127.0.0.1:{port} (UNAVAILABLE")
    assert "could not be reached again within sim.reconnect_s=2 s" in msg and "Check the simulator" not in msg
    assert msg.endswith("Restart `rlinf env serve` on that host, then resume the run from its last checkpoint")
    assert err.value.server_lost
    assert f"env worker 0 (envs 0-1): lost env server 127.0.0.1:{port}" in capsys.readouterr().err


def test_server_restarted_mid_run_reconnects_and_truncates(capsys) -> None:
    port = free_port()
    with server_process(port) as proc:
        env = _remote_env(port, reconnect_s=60)
        try:
            env.reset([0, 1, 2, 3])
            for _ in range(3):
                env.step(np.zeros(4, dtype=np.int64))
            proc.kill()
            proc.wait()
            with server_process(port):
                sb = env.step(np.zeros(4, dtype=np.int64))
                assert "reconnecting for up to 60 s (sim.reconnect_s)" in capsys.readouterr().err
                assert sb.truncated.all() and sb.final_obs is not None  # both sessions lost their episodes
                assert sb.stats["runtime/worker_restarts"] == 2.0
                after = env.step(np.zeros(4, dtype=np.int64))  # the new sessions step on
                assert not after.truncated.any()
        finally:
            env.close()


def test_every_server_outage_within_reconnect_s_is_survived(capsys) -> None:
    """Issue 31: a second short outage ended the run (the outages used up runtime.max_restarts).
    Outages after which the sessions served steps are free, however many; a server lost again
    before serving a step counts, so a server that keeps dying cannot loop forever."""
    port = free_port()
    zeros = np.zeros(4, dtype=np.int64)
    with contextlib.ExitStack() as servers:
        proc = servers.enter_context(server_process(port))
        env = _remote_env(port, reconnect_s=60, restarts=0)
        try:
            env.reset([0, 1, 2, 3])

            def outage() -> None:
                nonlocal proc
                proc.kill()
                proc.wait()
                proc = servers.enter_context(server_process(port))

            for _ in range(2):  # outages, with runtime.max_restarts=0
                env.step(zeros)
                outage()
                assert env.step(zeros).truncated.all()
            assert env.restarts == [0, 0]
            assert capsys.readouterr().err.count("reconnecting for up to 60 s") == 4  # two sessions, twice
            outage()  # no step served since the last one: this one counts
            with pytest.raises(EnvWorkerError, match=r"again before it served a step since its last restart; restarted 0 "
                                                     r"time\(s\) already \(runtime.max_restarts=0\)\. Check the log and "
                                                     r"memory of env server 127\.0\.0\.1:\d+, restart `rlinf env serve`"):
                env.step(zeros)
        finally:
            env.close()


def test_rl_names_the_resume_command_when_the_server_is_lost(cli, workdir) -> None:
    """`rlinf rl` whose server stays away: one line saying which server was lost, to restart it,
    and the command that resumes the run from its last checkpoint (issue 31)."""
    import threading

    port = free_port()
    first = workdir / "run" / "checkpoints" / "iter_000001"
    with server_process(port) as proc:
        def kill_after_first_checkpoint() -> None:
            deadline = time.monotonic() + 120
            while not first.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            proc.kill()

        killer = threading.Thread(target=kill_after_first_checkpoint, daemon=True)
        killer.start()
        res = cli("rl", "--algo", "ppo", "sim=remote", f"sim.address=127.0.0.1:{port}", "sim.reconnect_s=1",
                  "sim.sessions_per_server=1", "num_envs=2", "algo.rollout_steps=16", "total_steps=1000000",
                  "checkpoint.interval=1", "tracking.enabled=false", "progress=false", "run_dir=run")
        killer.join()
    assert res.code == 2 and "Traceback" not in res.err, res.err
    error = res.err.splitlines()[-1]  # before it: the run's notes and the reconnect warning
    assert error.startswith(f"error: env server 127.0.0.1:{port} was lost during "), res.err
    assert "Restart `rlinf env serve` on that host, then resume the run from its last checkpoint: rlinf rl resume=" in error
    resume = Path(error.rsplit("resume=", 1)[1])
    assert resume.parent == Path("run/checkpoints") and resume.name.startswith("iter_") and (workdir / resume).is_dir()


def stop_all_threads(pid: int, timeout: float = 30.0) -> None:
    """SIGSTOP ``pid`` and wait until every one of its threads has stopped.

    A group stop is not instantaneous: the kernel wakes one thread to carry it out, and until
    that thread runs (under load, many milliseconds), another thread woken by network data can
    still answer a request: the "hung" server would serve a step.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
            except OSError:  # a thread that just ended
                continue
        if states and all(st in "Tt" for st in states):
            return
        assert time.monotonic() < deadline, f"process {pid} did not stop: thread states {states}"
        time.sleep(0.01)


def test_hung_server_surfaces_after_worker_timeout() -> None:
    port = free_port()
    with server_process(port) as proc:
        # the first session of a fresh server process pays its start-up; on a loaded 2-core machine
        # that alone took over 2 s (make test, load average 5): open one with the default timeout first
        warm = _remote_env(port)
        warm.reset([0, 1, 2, 3])
        warm.close()
        env = _remote_env(port, reconnect_s=1, timeout_s=5, restarts=1)
        try:
            env.reset([0, 1, 2, 3])
            stop_all_threads(proc.pid)
            t0 = time.monotonic()
            with pytest.raises(EnvWorkerError, match=r"was lost during step \(no reply from 127.0.0.1:\d+ in 5 s .* "
                                                     r"could not be reached again within sim.reconnect_s=1 s"):
                env.step(np.zeros(4, dtype=np.int64))
            assert 5 <= time.monotonic() - t0 < 30
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            env.close()


# -- malformed and oversized messages ---------------------------------------------------------
def test_malformed_messages_close_that_session_and_the_server_serves_on(caplog) -> None:
    import grpc
    import msgpack

    sim = CounterSim(image=True)
    open_msg = {"op": "open", "protocol": wire.PROTOCOL, "shards": [[0, 2]], "autoreset": True, "codec": ["none", False, 1]}
    bad_sessions = {
        "garbage": [b"\x00\xff\xfe garbage"],
        "not open": [wire.pack({"op": "call", "method": "step", "args": [0]})],
        "bad shards": [wire.pack({**open_msg, "shards": [[3, 1]]})],
        "unknown method": [wire.pack(open_msg), wire.pack({"op": "call", "method": "__init__", "args": [0]})],
        "wrong action shape": [wire.pack(open_msg), wire.pack({"op": "call", "method": "step",
                                                               "args": [0, np.zeros((5,), np.int64)]})],
        "action out of range": [wire.pack(open_msg), wire.pack({"op": "call", "method": "step",
                                                                "args": [0, np.full((2,), 7, np.int64)]})],
        "object array": [wire.pack(open_msg), msgpack.packb({"op": "call", "method": "step", "args": [
            0, msgpack.ExtType(1, msgpack.packb(["|O", [2], b"x" * 16]))]})],
    }
    caplog.set_level(logging.INFO, logger="rlinf.env")
    with serving(sim, max_message_mb=0.1) as address:
        for name, messages in bad_sessions.items():
            channel = grpc.insecure_channel(address)
            call = channel.stream_stream(wire.SESSION)(iter(messages))
            with pytest.raises(grpc.RpcError) as err:
                for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, err.value.details())
            channel.close()
        channel = grpc.insecure_channel(address)
        with pytest.raises(grpc.RpcError):
            channel.unary_unary(wire.INFO)(b"\xc1", timeout=10)
        channel.close()
        # the server still serves, and the bad calls never reached the simulator: a good client
        # sees a fresh simulator
        env = _local("disaggregated").make_vec_env(RemoteSimulator({"address": address}), 2, True)
        try:
            obs = env.reset([5, 6])
            assert obs["state"][:, 1].tolist() == [5.0, 6.0]
            assert env.step(np.ones(2, np.int64)).reward.tolist() == [1.0, 1.0]
        finally:
            env.close()
    text = caplog.text
    assert text.count("closed the connection") >= len(bad_sessions)
    assert "malformed message" in text and "unknown method '__init__'" in text


def _session_call(address: str, messages: list, limit: int = 2**31 - 1):
    """The replies of one raw session stream that sends ``messages`` (and may send big ones)."""
    import grpc

    channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", limit), *wire.HTTP2_OPTIONS])
    try:
        return [wire.unpack(r) for r in channel.stream_stream(wire.SESSION)(iter(messages), timeout=60)]
    finally:
        channel.close()


def test_oversized_message_is_refused_by_grpc_and_the_server_serves_on() -> None:
    """Issue 31: the server held each message whole (up to 2x max_message_mb) before checking its
    size. gRPC now refuses it from its length, before buffering it: RESOURCE_EXHAUSTED."""
    import grpc

    open_msg = {"op": "open", "protocol": wire.PROTOCOL, "shards": [[0, 2]], "autoreset": True, "codec": ["none", False, 1]}
    with serving(CounterSim(), max_message_mb=0.1) as address:
        for messages in ([b"\x00" * 150_000], [wire.pack(open_msg), b"\x00" * 150_000]):  # first, or mid-session
            with pytest.raises(grpc.RpcError) as err:
                _session_call(address, messages)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"larger than max (150000 vs. {int(0.1 * 2**20)})" in err.value.details()
        replies = _session_call(address, [wire.pack(open_msg), wire.pack({"op": "close"})])
        assert replies[0]["ok"]["envs"] == 2 and replies[1] == {"ok": None}  # still serving


def test_server_memory_stays_bounded_under_oversized_messages() -> None:
    """Four concurrent 45 MB messages to a server limited to 24 MiB (within the old 2x + 1 MiB
    gRPC limit): refused from their length, so the server's peak memory barely moves (~20 MB
    here, against ~280 MB when they were buffered whole and then checked)."""
    import threading

    import grpc

    def peak_kb(pid: int) -> int:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        return int(status["VmHWM"].split()[0])

    port = free_port()
    payload = b"\x00" * (45 * 2**20)
    codes: list = []

    def send() -> None:
        try:
            _session_call(f"127.0.0.1:{port}", [payload])
        except grpc.RpcError as exc:
            codes.append(exc.code())

    with server_process(port, "max_message_mb=24") as proc:
        before = peak_kb(proc.pid)
        senders = [threading.Thread(target=send) for _ in range(4)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        grown_mb = (peak_kb(proc.pid) - before) / 1024
    assert codes == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 4
    assert grown_mb < 150, f"the server's peak memory grew by {grown_mb:.0f} MB"


def test_streams_beyond_the_cap_are_refused() -> None:
    """At most max_sessions + 8 streams and calls at once (each may hold up to max_message_mb):
    one more is refused at once with RESOURCE_EXHAUSTED, and the server serves on after."""
    import queue
    import threading

    import grpc

    from rlinf_cli.remote.messages import max_streams

    server = EnvServer(CounterSim(), ServeConfig(port=0, max_sessions=1), "test")
    opened = threading.Semaphore(0)

    class Ids:  # the session handler takes an id as it starts: count the streams that reached it
        n = 0

        def __next__(self) -> int:
            self.n += 1
            opened.release()
            return self.n

    server._ids = Ids()
    address = f"127.0.0.1:{server.start()}"
    channel = grpc.insecure_channel(address)
    idle: list = []
    try:
        cap = max_streams(server.cfg)
        assert cap == 9
        for _ in range(cap):  # streams that never send their first message hold their slot
            idle.append(channel.stream_stream(wire.SESSION)(iter(queue.Queue().get, None)))
        for _ in range(cap):
            assert opened.acquire(timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary(wire.INFO)(wire.pack({"protocol": wire.PROTOCOL}), timeout=30)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
        for call in idle:
            call.cancel()
        deadline = time.monotonic() + 30
        while True:  # the cancelled streams free their slots
            try:
                info = wire.unpack(channel.unary_unary(wire.INFO)(wire.pack({"protocol": wire.PROTOCOL}), timeout=30))
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
                time.sleep(0.1)
        assert info["protocol"] == wire.PROTOCOL
    finally:
        for call in idle:
            call.cancel()
        channel.close()
        server.stop(grace=0)


def test_simulator_errors_travel_as_one_line() -> None:
    sim = CounterSim(horizon=50, fail_env=1, fail_at=2, fail_how="raise")
    with serving(sim) as address:
        env = _local("disaggregated").make_vec_env(RemoteSimulator({"address": address}), 2, True)
        try:
            env.reset([0, 1])
            env.step(np.zeros(2, np.int64))
            with pytest.raises(EnvWorkerError, match="failed in step: ValueError: simulated physics blow-up in env 1$"):
                env.step(np.zeros(2, np.int64))
        finally:
            env.close()


# -- the server needs no torch ------------------------------------------------------------------
def test_server_runs_without_torch(tmp_path, cli) -> None:
    """`rlinf env serve` in an environment where torch, MLflow and pyarrow cannot be imported."""
    for name in ("torch", "mlflow", "pyarrow"):
        (tmp_path / "blocked" / name).mkdir(parents=True)
        (tmp_path / "blocked" / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed here')\n")
    port = free_port()
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "blocked"), os.environ.get("PYTHONPATH", "")])}
    with server_process(port, "start_method=spawn", env=env) as proc:
        res = cli("check-sim", "sim=remote", f"sim.address=127.0.0.1:{port}")
        assert res.code == 0, res.err
        assert proc.poll() is None
