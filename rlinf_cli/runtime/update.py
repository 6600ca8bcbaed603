"""The one on-policy update: advantages once, then epochs of shuffled minibatches.

Works for any :class:`~rlinf_cli.algorithm.Algorithm`, any policy and any world: the
algorithm supplies advantages and the loss, a :class:`~rlinf_cli.runtime.batches.Batches`
cuts the experience into minibatches the policy can evaluate (flat samples for embodied
policies, whole groups of completions for language models) or samples its replay buffer, the
engine owns the optimizer step. Nothing here calls back into the rollout.

With small policies a PPO run's thousands of tiny gradient steps are bound by Python and per-op
dispatch, so the loop stays lean: diagnostics are summed as one stacked tensor per step and
read back once per epoch.
"""

from __future__ import annotations

from typing import Any

import torch

from rlinf_cli.algorithm import Algorithm
from rlinf_cli.runtime.batches import Batches, ReplayBatches
from rlinf_cli.experience import Experience
from rlinf_cli.policy import declared_critic


class _Sums:
    """Diagnostics of many gradient steps, summed as one stacked tensor (read back once)."""

    def __init__(self, names: list[str] | None = None):
        self.names, self.total, self.count = names, None, 0

    def add(self, stats: dict[str, torch.Tensor]) -> None:
        if self.names is None:
            self.names = list(stats)
        row = torch.stack([_scalar(stats[k]) if k in stats else torch.tensor(float("nan")) for k in self.names])
        self.total = row if self.total is None else self.total.add_(row)
        self.count += 1

    def merge(self, other: "_Sums") -> None:
        self.names = other.names
        self.total = other.total.clone() if self.total is None else self.total.add_(other.total)
        self.count += other.count

    def means(self) -> dict[str, float]:
        if self.total is None:
            return {}
        return {f"train/{k}": v for k, v in zip(self.names or [], (self.total / max(self.count, 1)).tolist())
                if not k.endswith("_raw")}


def _scalar(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a detached 0-d fp32 CPU tensor; as it is where it already is one (most stats are:
    four no-op dispatches saved per stat and gradient step)."""
    if t.dim() == 0 and t.dtype == torch.float32 and not t.requires_grad and t.device.type == "cpu":
        return t
    return t.detach().reshape(()).float().cpu()


def _step(engine: Any, loss: torch.Tensor, stats: dict[str, torch.Tensor]) -> None:
    """Backward and optimizer step; the pre-clip gradient norm joins ``stats`` when known."""
    engine.backward(loss)
    norm = engine.step()
    if norm is not None:
        stats["grad_norm"] = torch.as_tensor(norm, dtype=torch.float32)


def update(engine: Any, algo: Algorithm, exp: Experience, batches: Batches, generator: torch.Generator,
           critic_only: bool = False, demos: Any = None, demo_coef: float = 0.0) -> dict[str, float]:
    """One training phase on ``exp``; returns mean diagnostics (``train/...``).

    ``demos`` (a dataset with ``sample(size, generator)``) and ``demo_coef`` > 0: every minibatch's
    loss gains ``demo_coef`` x the algorithm's imitation loss on as many demonstrated steps
    (:meth:`Algorithm.demo_loss`), drawn by ``generator`` (not during a critic-only warm-up).

    ``batches.epochs(exp, adv, ret, algo, generator)`` yields one iterable of minibatches per
    epoch. ``critic_only`` trains the value loss alone, stepping :meth:`Policy.critic_parameters` (a
    critic warm-up under a cloned actor). Under torchrun every rank calls this on its own
    experience; the epoch diagnostics that decide early stopping are averaged over ranks so that
    all ranks run the same number of steps.
    """
    if algo.rollout == "transitions":
        return update_transitions(engine, algo, exp, batches, generator)
    policy = engine.module
    adv, ret = algo.advantages(exp)
    critic = {id(p) for p in declared_critic(policy, algo.name)} if critic_only else set()
    frozen = [p for p in engine.params if id(p) not in critic] if critic_only else []
    run = _Sums()
    samples = epochs_run = 0
    run_lr = engine.lr
    warm_lr = algo.critic_only_lr() if critic_only else None
    imitate = demos is not None and demo_coef > 0 and not critic_only
    if warm_lr is not None:  # the schedule sets the lr again at the next iteration; restored below too
        engine.set_lr(warm_lr)
    policy.train()
    with engine.freeze(frozen):
        for minibatches in batches.epochs(exp, adv, ret, algo, generator):
            epoch = _Sums(run.names)
            for mb in minibatches:
                with engine.autocast():  # train.bf16: the forward pass and loss in mixed precision
                    out = policy.evaluate(mb.obs, mb.actions)
                    loss, stats = algo.loss(out, mb)
                    if imitate:
                        demo = algo.demo_loss(policy, demos.sample(int(mb.advantages.shape[0]), generator))
                        loss = loss + demo_coef * demo
                        stats["demo_loss"] = demo.detach()
                _step(engine, stats["value_loss_raw"] if critic_only else loss, stats)
                epoch.add(stats)
                if epochs_run == 0:
                    samples += int(mb.advantages.shape[0])
            epochs_run += 1
            if not epoch.count:
                break
            run.merge(epoch)
            epoch_mean = epoch.total / epoch.count
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                torch.distributed.all_reduce(epoch_mean)  # the same early-stop decision on every rank
                epoch_mean /= torch.distributed.get_world_size()
            if algo.stop_early(dict(zip(epoch.names or [], epoch_mean.tolist()))):
                break
    policy.eval()
    if warm_lr is not None:
        engine.set_lr(run_lr)
    return {**run.means(), "train/epochs": float(epochs_run), "train/samples": float(samples),
            "train/gradient_steps": float(run.count)}


def update_transitions(engine: Any, algo: Algorithm, exp: Experience, batches: ReplayBatches,
                       generator: torch.Generator) -> dict[str, float]:
    """The off-policy update: ``algo.gradient_steps(before, after)`` gradient steps (from the
    count of replayed transitions before and after this rollout), each on a batch sampled from
    the replay buffer (``batches.sample``), then ``algo.after_step`` (target networks)."""
    policy = engine.module
    collected = batches.collected()
    steps = algo.gradient_steps(collected - exp.env_steps, collected)
    run = _Sums()
    if steps:  # the warm-up's iterations train nothing: no switch to training mode
        _set_training(policy, True)
    for _ in range(steps):
        batch = batches.sample(algo, generator)
        with engine.autocast():  # train.bf16: the forward pass and loss in mixed precision
            loss, stats = algo.transition_loss(policy, batch)
        _step(engine, loss, stats)
        algo.after_step(policy)
        run.add(stats)
    if steps or policy.training:  # it leaves in eval mode, as before; once there, the check is free
        _set_training(policy, False)
    return {**run.means(), "train/gradient_steps": float(steps)}


def _set_training(policy: torch.nn.Module, mode: bool) -> None:
    """``policy.train(mode)``, cheaper where every submodule keeps ``nn.Module.train``: the same
    flag set on each, without ``nn.Module.__setattr__``'s checks (which only matter for parameters,
    submodules and buffers). The off-policy loop switches twice per iteration, i.e. per env step
    with SAC's ``rollout_steps=1``: ~150 -> ~45 us per pair for SAC's 34 modules, measured, out of
    a ~10 ms step. A module with a ``train`` of its own gets the real call."""
    modules = list(policy.modules())
    if any(type(m).train is not torch.nn.Module.train for m in modules):
        policy.train(mode)
        return
    for m in modules:
        object.__setattr__(m, "training", mode)
