"""Denoising steps vs speed for the flow head (``model.head=flow``): ``act`` time per action chunk
at N = 1, 4, 10 denoising steps, for ``model=mlp`` and ``model=vla`` (tiny backbone), with random
weights (built from configs, no download).

    OMP_NUM_THREADS=1 python benchmarks/flow_steps.py
    OMP_NUM_THREADS=1 python benchmarks/flow_steps.py --models mlp --envs 64 --repeats 50
    python benchmarks/flow_steps.py --accelerator cuda           # on a GPU (benchmarks/gpu_check.sh, check 11)

Each row: the median of ``--repeats`` calls of ``act`` (no gradient, ``--envs`` rows, one chunk of
``--chunk`` actions each), the steps timed alternately so that machine load hits them alike; the
``gaussian``/``chunk`` head on the same model (one pass, no denoising) as the reference. The VLA
reads a Meta-World-like state + instruction (the instruction's keys come from the prefix cache
after the first call); the prefix (image, proprio) runs once per act, each step runs K tokens.

A second table per model times PPO's training pass on recorded chains (``evaluate`` + backward on
``--train-rows`` rows): the N denoising steps scored one call per step against all N in one call.
"""

from __future__ import annotations

import argparse
import dataclasses
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


DEVICE = torch.device("cpu")
SYNC: Any = None  # the accelerator's synchronize (timings of asynchronous devices)


def _now() -> float:
    if SYNC is not None:
        SYNC()
    return time.perf_counter()


def _obs(model: str, envs: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    obs: dict[str, Any] = {"state": torch.randn(envs, 39, generator=g).to(DEVICE)}
    if model == "vla":
        obs["instruction"] = np.array([INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(envs)], dtype=object)
    return obs


def _where() -> str:
    return f"torch threads {torch.get_num_threads()}" if DEVICE.type == "cpu" else f"device {DEVICE}"


def run(model: str, steps: list[int], envs: int, repeats: int, chunk: int, noise: str) -> None:
    policies = [(name, p.to(DEVICE)) for name, p in _policies(model, steps, chunk, noise)]
    obs = _obs(model, envs)
    times: dict[str, list[float]] = {name: [] for name, _ in policies}
    with torch.no_grad():
        for _, p in policies:  # warm-up (and the VLA's instruction cache)
            p.eval().act(obs)
        for _ in range(repeats):
            for name, p in policies:
                t0 = _now()
                p.act(obs)
                times[name].append(_now() - t0)
    print(f"\nmodel={model}, {envs} envs, chunk K={chunk}, flow_noise={noise}, {repeats} repeats, "
          f"{_where()}")
    print("| head | act ms per call (all envs) | us per chunk (one env) |")
    print("|---|---|---|")
    for name, _ in policies:
        ms = statistics.median(times[name]) * 1e3
        print(f"| {name} | {ms:.2f} | {ms * 1e3 / envs:.1f} |")



def run_scoring(model: str, steps: list[int], rows: int, repeats: int, chunk: int, noise: str) -> None:
    """PPO's training pass over a minibatch of recorded chains (``evaluate`` + backward): the N
    steps scored one field call at a time (the default, as acting runs them) against all N in one
    call (``model.flow_batch_steps=true``), timed alternately on the same weights and chains."""
    from rlinf_model_mlp.flow import CHAIN_KEY

    policies = [(name, p.to(DEVICE)) for name, p in _policies(model, steps, chunk, noise) if name.startswith("flow")]
    obs = _obs(model, rows)
    print(f"\nmodel={model}, evaluate + backward on {rows} rows, chunk K={chunk}, flow_noise={noise}, "
          f"{repeats} repeats, {_where()}")
    print("| head | one call per step, ms | N steps in one call, ms | speed-up |")
    print("|---|---|---|---|")
    for name, p in policies:
        p.train()
        with torch.no_grad():
            out = p.act(obs)
        batch = {**obs, CHAIN_KEY: out.extras[CHAIN_KEY]}
        times: dict[bool, list[float]] = {False: [], True: []}
        for i in range(repeats + 1):
            for batched in (False, True):
                p.flow.s = dataclasses.replace(p.flow.s, batch_steps=batched)
                t0 = _now()
                ev = p.evaluate(batch, out.action)
                (ev.logprob.mean() + ev.value.mean()).backward()
                if i:  # the first round warms up (allocations, the VLA's caches)
                    times[batched].append(_now() - t0)
                p.zero_grad(set_to_none=True)
        seq, bat = (statistics.median(times[k]) * 1e3 for k in (False, True))
        print(f"| {name} | {seq:.2f} | {bat:.2f} | {seq / bat:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "vla"], choices=["mlp", "vla"])
    ap.add_argument("--steps", nargs="+", type=int, default=[1, 4, 10])
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--chunk", type=int, default=4)
    ap.add_argument("--noise", default="noise", choices=["noise", "sde"])
    ap.add_argument("--train-rows", type=int, default=128, help="minibatch rows of the evaluate + backward table "
                    "(the VLA's recommended PPO minibatch); 0 skips it")
    ap.add_argument("--accelerator", default="cpu", help="an accelerator plugin (cuda, rocm, ...): its device")
    args = ap.parse_args()
    global DEVICE, SYNC
    if args.accelerator != "cpu":
        from rlinf_cli.registry import get_registry

        accel = get_registry().load("accelerator", args.accelerator)()
        if not accel.is_available():
            raise SystemExit(f"accelerator {args.accelerator} is not available: {accel.missing()}")
        DEVICE, SYNC = accel.device(), getattr(accel.runtime(), "synchronize", None)
    for model in args.models:
        run(model, args.steps, args.envs, args.repeats, args.chunk, args.noise)
        if args.train_rows:
            run_scoring(model, args.steps, args.train_rows, args.repeats, args.chunk, args.noise)


if __name__ == "__main__":
    main()
