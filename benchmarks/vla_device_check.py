"""model=vla on an accelerator plugin's device: act and evaluate agree, one PPO step through the
training engine, and the instruction's KV cache is fresh after it. Case 6 of gpu_check.sh.

    python benchmarks/vla_device_check.py --accelerator cuda            # bf16 where the device supports it
    python benchmarks/vla_device_check.py --accelerator cpu --bf16 true # the same checks in bf16 on the CPU

For each head (``tokens``, ``chunk``) it builds the tiny default VLA (CNN on an 84x84 image,
proprioception, Meta-World instructions; random weights) on the device, cast to bf16 when
``--bf16`` says so (auto: when the accelerator supports it, not on the CPU), and checks, on 8 envs:

1. ``act`` with the prefix cache (no gradient) and the full pass (the same call with a gradient)
   give the same log-probs and values;
2. ``evaluate`` (teacher-forced, one pass, with a gradient) scores the acted actions with the
   acted log-probs: PPO's first ratio is 1 up to the tolerance;
3. one PPO step (the ``ppo`` algorithm's loss, ``make_engine``'s optimizer step, ``--backend``)
   changes the weights, and ``act`` afterwards matches the full pass with the new weights (a stale
   cache would not).

Tolerances: 1e-4 nats in fp32, 0.05 in bf16 (about 3 significant digits). Prints a JSON line per
head and ``act`` milliseconds per step with and without the cache; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

TASKS = ["reach-v3", "push-v3", "drawer-close-v3", "drawer-open-v3", "button-press-topdown-v3",
         "window-open-v3", "window-close-v3", "door-open-v3"]


def _policy(head: str, device, bf16: bool, prefix_cache: bool = True):
    import torch
    from omegaconf import OmegaConf

    from rlinf_cli.api import ArraySpec, EnvSpec
    from rlinf_model_vla.model import VLAPolicy

    conf = Path(__file__).resolve().parents[1] / "plugins_models/rlinf-model-vla/rlinf_model_vla/conf/model/vla.yaml"
    node = {**OmegaConf.to_container(OmegaConf.load(conf)), "head": head, "prefix_cache": prefix_cache}
    spec = EnvSpec({"rgb": ArraySpec((84, 84, 3), "uint8", 0, 255), "proprio": ArraySpec((4,), "float32"),
                    "instruction": ArraySpec((), "str")}, ArraySpec((4,), "float32", -1.0, 1.0))
    torch.manual_seed(0)
    policy = VLAPolicy(node, spec).to(device)
    return policy.to(torch.bfloat16) if bf16 else policy


def _obs(n: int, seed: int) -> dict:
    import torch

    from rlinf_sim_metaworld.tasks import INSTRUCTIONS

    g = torch.Generator().manual_seed(seed)
    return {"rgb": torch.randint(0, 256, (n, 84, 84, 3), generator=g, dtype=torch.uint8),
            "proprio": torch.randn(n, 4, generator=g),
            "instruction": np.array([INSTRUCTIONS[TASKS[i % len(TASKS)]] for i in range(n)], dtype=object)}


def _gap(a, b) -> float:
    return float((a.detach().float().cpu() - b.detach().float().cpu()).abs().max())


def check_head(head: str, accel, device, bf16: bool, backend: str, envs: int) -> dict:
    import torch

    from rlinf_cli.algorithm import MiniBatch
    from rlinf_cli.registry import get_registry
    from rlinf_cli.runtime.engine import make_engine

    tol = 0.05 if bf16 else 1e-4
    policy = _policy(head, device, bf16).eval()
    obs = _obs(envs, 0)
    sync = getattr(accel.runtime(), "synchronize", None) if device.type != "cpu" else None
    r: dict = {"head": head, "device": str(device), "dtype": "bf16" if bf16 else "fp32", "backend": backend,
               "tol": tol}

    def act_ms(p) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            p.act(obs)
        if sync:
            sync()
        return (time.perf_counter() - t0) * 1e3

    # act time per step: the same weights without the cache (a twin policy), alternately
    plain = _policy(head, device, bf16, prefix_cache=False).eval()
    plain.load_state_dict(policy.state_dict())
    full_ms, cached_ms = [], []
    for i in range(12):
        full_ms.append(act_ms(plain))
        cached_ms.append(act_ms(policy))
    r["act_ms_full"], r["act_ms_cached"] = round(statistics.median(full_ms[2:]), 2), round(statistics.median(cached_ms[2:]), 2)
    del plain

    def compare(tag: str) -> torch.Tensor:
        """Act (cached), then score the acted actions without (cached) and with a gradient (the
        full pass: a gradient turns the cache off). Same tokens on every path, so bf16's rounding
        cannot flip a sampled bin between them."""
        torch.manual_seed(1)
        with torch.no_grad():
            acted = policy.act(obs)
            scored = policy.evaluate(obs, acted.action)
        full = policy.evaluate(obs, acted.action)
        r[f"{tag}cache_vs_full_logp"] = _gap(scored.logprob, full.logprob)
        r[f"{tag}cache_vs_full_value"] = _gap(scored.value, full.value)
        r[f"{tag}act_vs_evaluate_logp"] = _gap(acted.logprob, full.logprob)
        r[f"{tag}act_vs_evaluate_value"] = _gap(acted.value, full.value)
        return acted, full

    acted, full = compare("")
    # one PPO step: the ppo algorithm's loss on the acted batch, the engine's optimizer step
    algo_cls = get_registry().load("algorithm", "ppo")
    # a large step, so that the outputs move by more than the tolerance: a stale cache would show
    algo = algo_cls.from_config({"name": "ppo", "lr": 1e-2})
    engine = make_engine(policy, algo.optim, {"backend": backend, "zero_stage": 2, "bf16": bf16}, accel)
    policy.train()
    g = torch.Generator().manual_seed(2)
    mb = MiniBatch(old_logprob=acted.logprob, advantages=torch.randn(envs, generator=g).to(device),
                   returns=torch.randn(envs, generator=g).to(device), old_values=acted.value,
                   obs=obs, actions=acted.action)
    loss, stats = algo.loss(policy.evaluate(obs, acted.action), mb)
    r["approx_kl_before_step"] = float(stats["approx_kl"])
    before = [p.detach().float().clone() for p in policy.lm.base_model.parameters()]
    engine.backward(loss)
    engine.step()
    policy.eval()
    r["loss_finite"] = bool(torch.isfinite(loss).item())
    r["backbone_moved"] = max(_gap(p, q) for p, q in zip(policy.lm.base_model.parameters(), before))
    with torch.no_grad():  # how far the step moved the scores of the same actions
        r["step_moved_logp"] = _gap(policy.evaluate(obs, acted.action).logprob, full.logprob)
    compare("after_step_")  # a stale instruction cache would score with the old weights
    r["ok"] = bool(r["loss_finite"] and r["backbone_moved"] > 0 and r["step_moved_logp"] > tol
                   and max(v for k, v in r.items() if k.endswith(("_logp", "_value")) and "moved" not in k) <= tol)
    del engine
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accelerator", default="cuda")
    ap.add_argument("--bf16", default="auto", choices=["auto", "true", "false"])
    ap.add_argument("--backend", default="torch", choices=["torch", "deepspeed"])
    ap.add_argument("--envs", type=int, default=8)
    a = ap.parse_args()

    import torch

    from rlinf_cli.registry import get_registry

    accel = get_registry().load("accelerator", a.accelerator)()
    if not accel.is_available():
        print(f"accelerator {a.accelerator} is not available: {accel.missing()}")
        return 1
    device = accel.device()
    bf16 = (accel.supports_bf16() and device.type != "cpu") if a.bf16 == "auto" else a.bf16 == "true"
    torch.set_num_threads(1) if device.type == "cpu" else None
    ok = True
    for head in ("tokens", "chunk"):
        r = check_head(head, accel, device, bf16, a.backend, a.envs)
        ok &= r["ok"]
        print(json.dumps(r))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
