"""Isaac-Cartpole-Direct env-steps/s: stepped natively by Isaac Lab vs through rlinf, side by side in one run.

For each batch size (16, 64, 256 envs) one Isaac Lab env is built (kit-less, Newton, CPU) and
stepped, alternately, by

- **native**: a plain loop of ``env.step(actions)`` with random action tensors (no policy): the limit;
- **rlinf rollout**: rlinf's ``Runner.collect_steps`` over the *same* env through the plugin's
  adapter and :class:`~rlinf_cli.runtime.batched.BatchedVecEnv` (numpy conversion, autoreset
  bookkeeping, final observations, episode statistics) with a 64x64 MLP actor-critic choosing the
  actions: what ``rlinf rl`` does per step with a batched simulator in its process;
- **rlinf via env server** (``--no-remote`` leaves it out): the same Runner and policy over
  ``sim=remote`` against an env server on this machine (``rlinf_cli.remote``; its session's worker
  process holds a second Isaac Lab env of the same size): one gRPC round trip per batched step,
  what training from .venv against ``rlinf env serve`` in .venv-isaaclab costs. On 2 cores the
  server's worker and this process share the CPU.

Repeats alternate the two so that load from other processes hits both alike; the ratio is the
median of the per-repeat ratios. Torch uses one thread. It runs in .venv-isaaclab (Python 3.12,
Isaac Lab); started from another Python it re-runs itself there.

    .venv-isaaclab/bin/python benchmarks/isaaclab_throughput.py
    python benchmarks/isaaclab_throughput.py --envs 16 64 256 --steps 64 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, table  # noqa: E402


class MLPPolicy:
    """A 64x64 tanh actor-critic (the shape of rlinf-model-mlp's default) with the Runner's interface."""

    has_critic = True

    def __init__(self, obs_dim: int, act_dim: int):
        import torch
        from torch import nn

        torch.manual_seed(0)
        self.torch = torch
        self.actor = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, act_dim))
        self.critic = nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
        self.log_std = torch.zeros(act_dim)

    def act(self, obs, deterministic: bool = False):
        from types import SimpleNamespace

        torch = self.torch
        x = obs["state"]
        mean = self.actor(x)
        dist = torch.distributions.Normal(mean, self.log_std.exp())
        a = mean if deterministic else dist.sample()
        return SimpleNamespace(action=a, logprob=dist.log_prob(a).sum(-1), value=self.critic(x).squeeze(-1))

    def get_value(self, obs):
        return self.critic(obs["state"]).squeeze(-1)


def measure(sizes: list[int], steps: int, repeats: int, assets: str, remote: bool) -> list[list[object]]:
    import torch

    torch.set_num_threads(1)
    for plugin in ("rlinf-sim-isaaclab", "rlinf-sim-remote"):
        sys.path.insert(0, str(REPO / "plugins_sims" / plugin))
    from rlinf_sim_isaaclab.sim import IsaacLabSimulator

    from rlinf_cli.runtime.batched import BatchedVecEnv
    from rlinf_cli.runtime.rollout import Runner

    sim = IsaacLabSimulator({"task": "Isaac-Cartpole-Direct", "asset_root": assets, "device": "cpu"})
    server = None
    if remote:
        from rlinf_sim_remote.sim import RemoteSimulator

        from rlinf_cli.remote.server import EnvServer, ServeConfig
        from rlinf_cli.runtime.placement import runtime_config
        from rlinf_cli.runtime.hosting import hosted_vec_env

        server = EnvServer(sim, ServeConfig(port=0, start_method="spawn"), "isaaclab")
        remote_sim = RemoteSimulator({"address": f"127.0.0.1:{server.start()}"})
    rows = []
    try:
        for n in sizes:
            batch = sim.make_batched_env(list(range(n)))
            raw = batch.env  # the gymnasium-wrapped Isaac Lab env itself
            vec = BatchedVecEnv(sim.spec, batch, autoreset=True)
            policy = MLPPolicy(sim.spec.observation["state"].shape[0], sim.spec.action.shape[0])
            runners = {"rlinf": Runner(vec, policy)}
            if remote:
                runners["remote"] = Runner(hosted_vec_env(remote_sim, runtime_config(None), n, True, "bench"), policy)
            for r in runners.values():
                r.reset(list(range(n)))
            gen = torch.Generator().manual_seed(0)
            rates: dict[str, list[float]] = {"native": [], **{k: [] for k in runners}}
            with torch.no_grad():
                for _ in range(5):  # warm-up: first steps pay for lazy initialisation
                    raw.step(torch.rand((n, 1), generator=gen) * 2 - 1)
                for r in runners.values():
                    r.collect_steps(5)
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        raw.step(torch.rand((n, 1), generator=gen) * 2 - 1)
                    rates["native"].append(n * steps / (time.perf_counter() - t0))
                    for k, r in runners.items():
                        t0 = time.perf_counter()
                        r.collect_steps(steps)
                        rates[k].append(n * steps / (time.perf_counter() - t0))
            for r in runners.values():
                r.env.close()
            row: list[object] = [n, f"{median(rates['native']):,.0f}"]
            for k in runners:
                ratios = [b / a for a, b in zip(rates["native"], rates[k])]
                row += [f"{median(rates[k]):,.0f}", f"{median(ratios):.0%} ({min(ratios):.0%}-{max(ratios):.0%})"]
            rows.append(row)
            print("  " + "  ".join(str(x) for x in row), file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop(grace=0)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--steps", type=int, default=64, help="batched steps per timed repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--assets", default=str(REPO / ".venv-isaaclab" / "isaac-assets"))
    p.add_argument("--no-remote", dest="remote", action="store_false", help="leave out the env-server column")
    args = p.parse_args()
    try:
        import isaaclab  # noqa: F401
    except ImportError:
        py = REPO / ".venv-isaaclab" / "bin" / "python"
        if not py.exists():
            sys.exit("needs .venv-isaaclab (Python 3.12 + Isaac Lab): run `make isaaclab`")
        os.execv(str(py), [str(py), *sys.argv])
    print(machine_line())
    print(f"Isaac-Cartpole-Direct, kit-less Newton on CPU, torch threads 1; {args.steps} batched steps x "
          f"{args.repeats} repeats per size, alternating native / rlinf" + (" / env server" if args.remote else ""))
    rows = measure(args.envs, args.steps, args.repeats, args.assets, args.remote)
    headers = ["envs", "native env-steps/s", "rlinf rollout env-steps/s", "ratio (median, range)"]
    if args.remote:
        headers += ["rlinf via env server", "ratio (median, range)"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
