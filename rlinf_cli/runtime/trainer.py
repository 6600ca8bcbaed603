"""The generic update: advantages once, then epochs of shuffled minibatches.

Works for any :class:`~rlinf_cli.algorithm.Algorithm` and any :class:`~rlinf_cli.policy.Policy`:
the algorithm supplies advantages and the loss, the policy ``evaluate``.
"""

from __future__ import annotations

from typing import Any

import torch

from rlinf_cli.algorithm import Algorithm, MiniBatch
from rlinf_cli.policy import Policy
from rlinf_cli.runtime.rollout import Rollout


def make_optimizer(policy: torch.nn.Module, cfg: Any) -> torch.optim.Optimizer:
    params = [p for p in policy.parameters() if p.requires_grad]
    if getattr(cfg, "weight_decay", 0.0):
        return torch.optim.AdamW(params, lr=cfg.lr, eps=1e-5, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr, eps=1e-5)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def update(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    algo: Algorithm,
    rollout: Rollout,
    generator: torch.Generator,
    train_actor: bool = True,
) -> dict[str, float]:
    """One training phase on a rollout; returns mean diagnostics.

    ``train_actor=False`` trains the critic only (warming up a critic under a cloned actor).
    """
    cfg = algo.config
    adv, ret = algo.advantages(rollout)  # [T, N]
    valid = rollout.mask.reshape(-1) > 0
    keep_all = bool(valid.all())

    def flat(x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, *x.shape[2:])
        return x if keep_all else x[valid]

    obs = {k: flat(v) for k, v in rollout.obs.items()}
    actions = flat(rollout.actions)
    data = MiniBatch(flat(rollout.logprobs), flat(adv), flat(ret), flat(rollout.values))
    n = actions.shape[0]
    if n == 0:
        return {"train/samples": 0.0}
    mb_size = min(cfg.minibatch_size, n)
    sums: dict[str, torch.Tensor] = {}
    count = 0
    epochs_run = 0
    policy.train()
    for _epoch in range(cfg.epochs):
        epoch_sums: dict[str, torch.Tensor] = {}
        epoch_count = 0
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, mb_size):
            idx = perm[start:start + mb_size]
            out = policy.evaluate({k: v[idx] for k, v in obs.items()}, actions[idx])
            mb = MiniBatch(*(None if t is None else t[idx] for t in data))
            loss, stats = algo.loss(out, mb)
            if not train_actor:
                loss = stats["value_loss_raw"]
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.max_grad_norm is not None:
                stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
            optimizer.step()
            for k, v in stats.items():
                epoch_sums[k] = epoch_sums.get(k, 0.0) + v.detach()
            epoch_count += 1
        epochs_run += 1
        for k, v in epoch_sums.items():
            sums[k] = sums.get(k, 0.0) + v
        count += epoch_count
        if algo.stop_early({k: float(v) / epoch_count for k, v in epoch_sums.items()}):
            break
    policy.eval()
    metrics = {f"train/{k}": float(v) / max(count, 1) for k, v in sums.items() if not k.endswith("_raw")}
    metrics["train/epochs"] = float(epochs_run)
    metrics["train/samples"] = float(n)
    return metrics
