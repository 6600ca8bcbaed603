"""model=vla act time per step with the instruction's KV cache (model.prefix_cache=true, the
default) and without it, side by side in one process.

Each configuration builds one policy with random weights (no download: the backbone is built from
a transformers config) and a copy of it with ``prefix_cache=false``, then times ``act`` on the same
observations alternately (so machine load hits both alike) and reports the median. Envs carry
Meta-World's instructions (``--tasks``, one task per env in turn), as in a multi-task rollout.

Backbones: ``tiny`` (the model=vla default: a Qwen2 of 2 layers x 128) and ``smollm2-sized``
(SmolLM2-135M's shape: 30 layers x 576, 9 heads, 3 key/value heads, MLP 1536; random weights).
Both use the tiny preset's character tokenizer, so an instruction is one token per character
(about 14-30 tokens); ``--max-instruction-tokens 6`` cuts them to about what a BPE tokenizer
such as SmolLM2's gives these short texts.

    OMP_NUM_THREADS=1 python benchmarks/vla_prefix_cache.py                 # both backbones, both heads
    OMP_NUM_THREADS=1 python benchmarks/vla_prefix_cache.py --backbones tiny --repeats 50
    OMP_NUM_THREADS=1 python benchmarks/vla_prefix_cache.py --rollout --backbones tiny   # real Meta-World envs

``--rollout``: instead of ``act`` alone, rollouts of the runtime's ``Runner`` on Meta-World envs
(one env per task, in this process, state + instruction), ``--repeats`` blocks of 16 policy steps
for each policy, alternating; policy steps per second (all envs), environment stepping included.

``--train``: a training step instead: ``evaluate`` + backward of a PPO-sized minibatch
(``--minibatch``, rows carrying the tasks' instructions) in train mode, with the gradient. With
the prefix shared, each distinct instruction runs once per minibatch and its rows share its
keys/values; without, every row runs its own instruction. Reports milliseconds per step and the
largest gradient difference between the two paths.

    OMP_NUM_THREADS=1 python benchmarks/vla_prefix_cache.py --train --backbones tiny

Columns: milliseconds per ``act`` call (all envs at once, no gradient) without and with the
cache, the speed-up, ``cold``: the first act after a weight change (the cache refilled: what each
rollout after an update pays once), and the largest log-prob difference between the two paths.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, median, table  # noqa: E402

TASKS = ["reach-v3", "push-v3", "drawer-close-v3", "drawer-open-v3", "button-press-topdown-v3",
         "window-open-v3", "window-close-v3", "door-open-v3"]
BACKBONES = {
    "tiny": {},  # the model=vla defaults (conf/model/vla.yaml)
    "smollm2-sized": {"hidden_size": 576, "layers": 30, "heads": 9, "kv_heads": 3, "intermediate_size": 1536,
                      "max_positions": 512},
}


def _policies(backbone: str, head: str, pixels: bool, max_tokens: int, spec=None) -> tuple:
    import torch
    from omegaconf import OmegaConf

    from rlinf_cli.api import ArraySpec, EnvSpec
    from rlinf_model_vla.model import VLAPolicy

    conf = Path(__file__).resolve().parents[1] / "plugins_models/rlinf-model-vla/rlinf_model_vla/conf/model/vla.yaml"
    node = OmegaConf.to_container(OmegaConf.load(conf))
    node["backbone"] = {**node["backbone"], **BACKBONES[backbone]}
    node.update(head=head, max_instruction_tokens=max_tokens)
    # Meta-World's observations: the 39-d state, or an 84x84 image + the 4-d proprioception
    if spec is None:
        obs = {"instruction": ArraySpec((), "str")}
        if pixels:
            obs.update(rgb=ArraySpec((84, 84, 3), "uint8", 0, 255), proprio=ArraySpec((4,), "float32"))
        else:
            obs["state"] = ArraySpec((39,), "float32")
        spec = EnvSpec(obs, ArraySpec((4,), "float32", -1.0, 1.0))
    torch.manual_seed(0)
    cached = VLAPolicy(node, spec).eval()
    plain = VLAPolicy({**node, "prefix_cache": False}, spec).eval()
    plain.load_state_dict(cached.state_dict())
    return cached, plain


def _obs(n: int, tasks: list[str], pixels: bool, seed: int) -> dict:
    import torch

    from rlinf_sim_metaworld.tasks import INSTRUCTIONS

    g = torch.Generator().manual_seed(seed)
    o = {"instruction": np.array([INSTRUCTIONS[tasks[i % len(tasks)]] for i in range(n)], dtype=object)}
    if pixels:
        o["rgb"] = torch.randint(0, 256, (n, 84, 84, 3), generator=g, dtype=torch.uint8)
        o["proprio"] = torch.randn(n, 4, generator=g)
    else:
        o["state"] = torch.randn(n, 39, generator=g)
    return o


def _act_ms(policy, obs: dict) -> tuple[float, object]:
    import torch

    with torch.no_grad():
        t0 = time.perf_counter()
        out = policy.act(obs, deterministic=True)
        return (time.perf_counter() - t0) * 1e3, out


def run(backbone: str, head: str, a: argparse.Namespace) -> list:
    cached, plain = _policies(backbone, head, a.pixels, a.max_instruction_tokens)
    params = sum(p.numel() for p in cached.parameters())
    steps = [_obs(a.envs, a.tasks, a.pixels, seed) for seed in range(a.repeats)]
    for o in steps[:2]:  # warm-up: allocator, kernels, the tokenizer's and the prefix caches
        _act_ms(plain, o)
        _act_ms(cached, o)
    t_plain, t_cached, diff = [], [], 0.0
    for o in steps:  # alternate, so that load from other processes falls on both
        ms, ref = _act_ms(plain, o)
        t_plain.append(ms)
        ms, out = _act_ms(cached, o)
        t_cached.append(ms)
        diff = max(diff, float((out.logprob - ref.logprob).abs().max()), float((out.value - ref.value).abs().max()))
    cold = []
    for o in steps[: max(3, a.repeats // 5)]:
        cached.invalidate_prefix_cache()  # what an optimizer step does to it
        cold.append(_act_ms(cached, o)[0])
    rows = [len(cached._text_ids(t)) for t in set(steps[0]["instruction"])]
    up, uc = median(t_plain), median(t_cached)
    return [backbone, head, f"{params / 1e6:.1f}M", f"{min(rows)}-{max(rows)}", f"{up:.2f}", f"{uc:.2f}",
            f"{up / uc:.2f}x", f"{median(cold):.2f}", f"{diff:.1e}"]


def _train_ms(policy, obs: dict, action) -> tuple[float, dict]:
    t0 = time.perf_counter()
    policy.zero_grad(set_to_none=True)
    ev = policy.evaluate(obs, action)
    (ev.logprob.mean() + ev.value.pow(2).mean() + 0.01 * ev.entropy.mean()).backward()
    ms = (time.perf_counter() - t0) * 1e3
    return ms, {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}


def run_train(backbone: str, head: str, a: argparse.Namespace) -> list:
    import torch

    cached, plain = _policies(backbone, head, a.pixels, a.max_instruction_tokens)
    cached.train()
    plain.train()
    steps = [_obs(a.minibatch, a.tasks, a.pixels, seed) for seed in range(a.repeats)]
    with torch.no_grad():
        actions = [plain.act(o).action for o in steps]
    for o, act in list(zip(steps, actions))[:2]:  # warm-up
        _train_ms(plain, o, act)
        _train_ms(cached, o, act)
    t_plain, t_cached, diff = [], [], 0.0
    for o, act in zip(steps, actions):  # alternate, so that load from other processes falls on both
        ms, ref = _train_ms(plain, o, act)
        t_plain.append(ms)
        ms, grads = _train_ms(cached, o, act)
        t_cached.append(ms)
        diff = max(diff, max(float((grads[n] - ref[n]).abs().max()) for n in ref))
    up, uc = median(t_plain), median(t_cached)
    params = sum(p.numel() for p in cached.parameters())
    return [backbone, head, f"{params / 1e6:.1f}M", f"{up:.1f}", f"{uc:.1f}", f"{up / uc:.2f}x", f"{diff:.1e}"]


def run_rollout(backbone: str, head: str, a: argparse.Namespace) -> list:
    from rlinf_cli.registry import make_simulator
    from rlinf_cli.runtime.chunking import ChunkedSimulator, chunk_of
    from rlinf_cli.runtime.rollout import Runner
    from rlinf_cli.runtime.vector import SyncVecEnv

    sim = make_simulator({"name": "metaworld", "tasks": list(a.tasks), "max_episode_steps": 100})
    policies = _policies(backbone, head, False, a.max_instruction_tokens, spec=sim.spec)
    if chunk_of(policies[0]) > 1:  # what the runtime does for a chunk policy
        sim = ChunkedSimulator(sim, chunk_of(policies[0]))
    runners = []
    for policy in policies:
        env = SyncVecEnv(sim, range(a.envs), autoreset=True)
        runner = Runner(env, policy)
        runner.reset(list(range(a.envs)))  # both see the same seeds, hence the same tasks per env
        runner.collect_steps(4)  # warm-up
        runners.append(runner)
    rates: list[list[float]] = [[], []]
    for _ in range(a.repeats):  # alternate, so that load from other processes falls on both
        for i, runner in enumerate(runners):
            t0 = time.perf_counter()
            runner.collect_steps(16)
            rates[i].append(16 * a.envs / (time.perf_counter() - t0))
    cached, plain = median(rates[0]), median(rates[1])
    params = sum(p.numel() for p in policies[0].parameters())
    return [backbone, head, f"{params / 1e6:.1f}M", f"{plain:.0f}", f"{cached:.0f}", f"{cached / plain:.2f}x"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backbones", nargs="+", default=list(BACKBONES), choices=list(BACKBONES))
    ap.add_argument("--heads", nargs="+", default=["tokens", "chunk"], choices=["tokens", "chunk"])
    ap.add_argument("--envs", type=int, default=8)
    ap.add_argument("--tasks", nargs="+", default=TASKS, help="Meta-World tasks whose instructions the envs carry")
    ap.add_argument("--pixels", action="store_true", help="an 84x84 image (4 CNN tokens) + proprio, not the state")
    ap.add_argument("--max-instruction-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20, help="timed act calls per path (median reported)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rollout", action="store_true", help="time Runner rollouts on Meta-World envs, not act alone")
    ap.add_argument("--train", action="store_true", help="time evaluate + backward of a minibatch, not act")
    ap.add_argument("--minibatch", type=int, default=128, help="--train: rows per minibatch")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    print(f"{machine_line()}  torch {torch.__version__}  threads {a.threads}")
    if a.rollout:
        print(f"{a.envs} Meta-World envs ({len(a.tasks)} tasks), state + instruction, {a.repeats} x 16 policy steps "
              "per policy, sampled actions, env stepping included")
        rows = [run_rollout(b, h, a) for b in a.backbones for h in a.heads]
        print(table(["backbone", "head", "params", "uncached steps/s", "cached steps/s", "speed-up"], rows))
        return
    if a.train:
        print(f"minibatch of {a.minibatch} rows, {'pixels + proprio' if a.pixels else 'state'} + instruction, "
              f"instructions of {len(a.tasks)} Meta-World tasks, {a.repeats} repeats, evaluate + backward")
        rows = [run_train(b, h, a) for b in a.backbones for h in a.heads]
        print(table(["backbone", "head", "params", "per-row prefix ms", "shared prefix ms", "speed-up",
                     "max |grad diff|"], rows))
        return
    print(f"{a.envs} envs, {'pixels + proprio' if a.pixels else 'state'} + instruction, "
          f"instructions of {len(a.tasks)} Meta-World tasks, {a.repeats} repeats, greedy act")
    rows = [run(b, h, a) for b in a.backbones for h in a.heads]
    print(table(["backbone", "head", "params", "instr. tokens", "uncached ms", "cached ms", "speed-up", "cold ms",
                 "max |diff|"], rows))


if __name__ == "__main__":
    main()
