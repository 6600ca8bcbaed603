"""Isaac-Cartpole-Direct env-steps/s: stepped natively by Isaac Lab vs through rlinf, side by side in one run.

For each batch size (16, 64, 256 envs) one Isaac Lab env is built (kit-less, Newton, CPU) and
stepped, alternately, by

- **native**: a plain loop of ``env.step(actions)`` with random action tensors (no policy): the limit;
- **rlinf rollout**: rlinf's ``Runner.collect_steps`` over the *same* env through the plugin's
  adapter and :class:`~rlinf_cli.runtime.batched.BatchedVecEnv` (numpy conversion, autoreset
  bookkeeping, final observations, episode statistics) with a 64x64 MLP actor-critic choosing the
  actions: what ``rlinf rl`` does per step with a batched simulator in its process.

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


def measure(sizes: list[int], steps: int, repeats: int, assets: str) -> list[list[object]]:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(REPO / "plugins_sims" / "rlinf-sim-isaaclab"))
    from rlinf_sim_isaaclab.sim import IsaacLabSimulator

    from rlinf_cli.runtime.batched import BatchedVecEnv
    from rlinf_cli.runtime.rollout import Runner

    sim = IsaacLabSimulator({"task": "Isaac-Cartpole-Direct", "asset_root": assets, "device": "cpu"})
    rows = []
    for n in sizes:
        batch = sim.make_batched_env(list(range(n)))
        raw = batch.env  # the gymnasium-wrapped Isaac Lab env itself
        vec = BatchedVecEnv(sim.spec, batch, autoreset=True)
        policy = MLPPolicy(sim.spec.observation["state"].shape[0], sim.spec.action.shape[0])
        runner = Runner(vec, policy)
        runner.reset(list(range(n)))
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for _ in range(5):  # warm-up: first steps pay for lazy initialisation
                raw.step(torch.rand((n, 1), generator=gen) * 2 - 1)
            runner.collect_steps(5)
            native, through, ratios = [], [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                for _ in range(steps):
                    raw.step(torch.rand((n, 1), generator=gen) * 2 - 1)
                a = n * steps / (time.perf_counter() - t0)
                t0 = time.perf_counter()
                runner.collect_steps(steps)
                b = n * steps / (time.perf_counter() - t0)
                native.append(a)
                through.append(b)
                ratios.append(b / a)
        vec.close()
        rows.append([n, f"{median(native):,.0f}", f"{median(through):,.0f}", f"{median(ratios):.0%}",
                     f"{min(ratios):.0%}-{max(ratios):.0%}"])
        print(f"  {n} envs: native {median(native):,.0f}, rlinf {median(through):,.0f} env-steps/s "
              f"(ratio {median(ratios):.0%})", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--steps", type=int, default=64, help="batched steps per timed repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--assets", default=str(REPO / ".venv-isaaclab" / "isaac-assets"))
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
          f"{args.repeats} repeats per size, alternating native / rlinf")
    rows = measure(args.envs, args.steps, args.repeats, args.assets)
    print(table(["envs", "native env-steps/s", "rlinf rollout env-steps/s", "ratio (median)", "ratio range"], rows))


if __name__ == "__main__":
    main()
