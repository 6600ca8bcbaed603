"""Denoising steps vs speed for the flow head (``model.head=flow``): ``act`` time per action chunk
at N = 1, 4, 10 denoising steps, for ``model=mlp`` and ``model=vla`` (tiny backbone), with random
weights (built from configs, no download).

    OMP_NUM_THREADS=1 python benchmarks/flow_steps.py
    OMP_NUM_THREADS=1 python benchmarks/flow_steps.py --models mlp --envs 64 --repeats 50

Each row: the median of ``--repeats`` calls of ``act`` (no gradient, ``--envs`` rows, one chunk of
``--chunk`` actions each), the steps timed alternately so that machine load hits them alike; the
``gaussian``/``chunk`` head on the same model (one pass, no denoising) as the reference. The VLA
reads a Meta-World-like state + instruction (the instruction's keys come from the prefix cache
after the first call); the prefix (image, proprio) runs once per act, each step runs K tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch

from rlinf_cli.api import ArraySpec, EnvSpec

INSTRUCTIONS = ["reach the goal position", "push the puck to the goal", "open the drawer", "press the button"]


def _spec(state: int, dims: int, text: bool) -> EnvSpec:
    obs = {"state": ArraySpec((state,), "float32")}
    if text:
        obs["instruction"] = ArraySpec((), "str")
    return EnvSpec(obs, ArraySpec((dims,), "float32", -1.0, 1.0))


def _policies(model: str, steps: list[int], chunk: int, noise: str) -> list[tuple[str, Any]]:
    torch.manual_seed(0)
    if model == "mlp":
        from rlinf_model_mlp.model import MLPPolicy

        spec = _spec(39, 4, False)
        base = {"name": "mlp", "hidden_sizes": [256, 256]}
        out = [("gaussian (1 action)", MLPPolicy(base, spec))]
        out += [(f"flow N={n}", MLPPolicy({**base, "head": "flow", "chunk": chunk, "flow_steps": n,
                                           "flow_noise": noise}, spec)) for n in steps]
        return out
    from omegaconf import OmegaConf

    from rlinf_model_vla.model import VLAPolicy

    import rlinf_model_vla

    conf = OmegaConf.to_container(OmegaConf.load(f"{rlinf_model_vla.__path__[0]}/conf/model/vla.yaml"))
    spec = _spec(39, 4, True)
    out = [(f"chunk (K={chunk}, one pass)", VLAPolicy({**conf, "head": "chunk", "chunk": max(chunk, 2)}, spec))]
    out += [(f"flow N={n}", VLAPolicy({**conf, "head": "flow", "chunk": chunk, "flow_steps": n, "flow_noise": noise},
                                      spec)) for n in steps]
    return out


def _obs(model: str, envs: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    obs: dict[str, Any] = {"state": torch.randn(envs, 39, generator=g)}
    if model == "vla":
        obs["instruction"] = np.array([INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(envs)], dtype=object)
    return obs


def run(model: str, steps: list[int], envs: int, repeats: int, chunk: int, noise: str) -> None:
    policies = _policies(model, steps, chunk, noise)
    obs = _obs(model, envs)
    times: dict[str, list[float]] = {name: [] for name, _ in policies}
    with torch.no_grad():
        for _, p in policies:  # warm-up (and the VLA's instruction cache)
            p.eval().act(obs)
        for _ in range(repeats):
            for name, p in policies:
                t0 = time.perf_counter()
                p.act(obs)
                times[name].append(time.perf_counter() - t0)
    print(f"\nmodel={model}, {envs} envs, chunk K={chunk}, flow_noise={noise}, {repeats} repeats, "
          f"torch threads {torch.get_num_threads()}")
    print("| head | act ms per call (all envs) | us per chunk (one env) |")
    print("|---|---|---|")
    for name, _ in policies:
        ms = statistics.median(times[name]) * 1e3
        print(f"| {name} | {ms:.2f} | {ms * 1e3 / envs:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "vla"], choices=["mlp", "vla"])
    ap.add_argument("--steps", nargs="+", type=int, default=[1, 4, 10])
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--noise", default="noise", choices=["noise", "sde"])
    args = ap.parse_args()
    for model in args.models:
        run(model, args.steps, args.envs, args.repeats, args.chunk, args.noise)


if __name__ == "__main__":
    main()
