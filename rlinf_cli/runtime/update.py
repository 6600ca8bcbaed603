"""The one on-policy update: advantages once, then epochs of shuffled minibatches.

Works for any :class:`~rlinf_cli.algorithm.Algorithm`, any policy and any collector: the
algorithm supplies advantages and the loss, the collector cuts the experience into minibatches
the policy can evaluate (flat samples for embodied policies, whole groups of completions for
language models), the engine owns the optimizer step.

With small policies a PPO run's thousands of tiny gradient steps are bound by Python and per-op
dispatch, so the loop stays lean: diagnostics are summed as one stacked tensor per step and
read back once per epoch.
"""

from __future__ import annotations

from typing import Any

import torch

from rlinf_cli.algorithm import Algorithm
from rlinf_cli.experience import Experience


def update(engine: Any, algo: Algorithm, exp: Experience, collector: Any, generator: torch.Generator,
           critic_only: bool = False) -> dict[str, float]:
    """One training phase on ``exp``; returns mean diagnostics (``train/...``).

    ``collector.epochs(exp, adv, ret, algo, generator)`` yields one iterable of minibatches per
    epoch. ``critic_only`` trains the value loss alone, stepping :meth:`Policy.critic_parameters` (a
    critic warm-up under a cloned actor). Under torchrun every rank calls this on its own
    experience; the epoch diagnostics that decide early stopping are averaged over ranks so that
    all ranks run the same number of steps.
    """
    if algo.rollout == "transitions":
        return update_transitions(engine, algo, exp, collector, generator)
    policy = engine.module
    adv, ret = algo.advantages(exp)
    critic = {id(p) for p in policy.critic_parameters()} if critic_only else set()
    frozen = [p for p in engine.params if id(p) not in critic] if critic_only else []
    names: list[str] | None = None
    total: torch.Tensor | None = None
    count = samples = epochs_run = 0
    run_lr = engine.lr
    warm_lr = algo.critic_only_lr() if critic_only else None
    if warm_lr is not None:  # the schedule sets the lr again at the next iteration; restored below too
        engine.set_lr(warm_lr)
    policy.train()
    with engine.freeze(frozen):
        for batches in collector.epochs(exp, adv, ret, algo, generator):
            epoch_sum: torch.Tensor | None = None
            epoch_count = 0
            for mb in batches:
                out = policy.evaluate(mb.obs, mb.actions)
                loss, stats = algo.loss(out, mb)
                if critic_only:
                    loss = stats["value_loss_raw"]
                engine.backward(loss)
                norm = engine.step()
                if norm is not None:
                    stats["grad_norm"] = torch.as_tensor(norm, dtype=torch.float32)
                if names is None:
                    names = list(stats)
                row = torch.stack([stats[k].detach().reshape(()).float().cpu() if k in stats
                                   else torch.tensor(float("nan")) for k in names])
                epoch_sum = row if epoch_sum is None else epoch_sum.add_(row)
                epoch_count += 1
                if epochs_run == 0:
                    samples += int(mb.advantages.shape[0])
            epochs_run += 1
            if epoch_sum is None:
                break
            total = epoch_sum.clone() if total is None else total.add_(epoch_sum)
            count += epoch_count
            epoch_mean = epoch_sum / epoch_count
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.all_reduce(epoch_mean)  # the same early-stop decision on every rank
                epoch_mean /= torch.distributed.get_world_size()
            if algo.stop_early(dict(zip(names or [], epoch_mean.tolist()))):
                break
    policy.eval()
    if warm_lr is not None:
        engine.set_lr(run_lr)
    means = (total / max(count, 1)).tolist() if total is not None else []
    metrics = {f"train/{k}": v for k, v in zip(names or [], means) if not k.endswith("_raw")}
    metrics.update({"train/epochs": float(epochs_run), "train/samples": float(samples),
                    "train/gradient_steps": float(count)})
    return metrics


def update_transitions(engine: Any, algo: Algorithm, exp: Experience, collector: Any,
                       generator: torch.Generator) -> dict[str, float]:
    """The off-policy update: ``algo.gradient_steps(before, after)`` gradient steps (from the
    collector's count of transitions before and after this rollout), each on a batch the collector
    samples from its replay buffer (``collector.sample``), then ``algo.after_step`` (target networks)."""
    policy = engine.module
    collected = collector.collected()
    steps = algo.gradient_steps(collected - exp.env_steps, collected)
    names: list[str] | None = None
    total: torch.Tensor | None = None
    policy.train()
    for _ in range(steps):
        batch = collector.sample(algo, generator)
        loss, stats = algo.transition_loss(policy, batch)
        engine.backward(loss)
        norm = engine.step()
        algo.after_step(policy)
        if norm is not None:
            stats["grad_norm"] = torch.as_tensor(norm, dtype=torch.float32)
        if names is None:
            names = list(stats)
        row = torch.stack([stats[k].detach().reshape(()).float().cpu() for k in names])
        total = row if total is None else total.add_(row)
    policy.eval()
    if warm_lr is not None:
        engine.set_lr(run_lr)
    means = (total / max(steps, 1)).tolist() if total is not None else []
    metrics = {f"train/{k}": v for k, v in zip(names or [], means)}
    metrics["train/gradient_steps"] = float(steps)
    return metrics
