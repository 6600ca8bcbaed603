"""The generic update: advantages once, then epochs of shuffled minibatches.

Works for any :class:`~rlinf_cli.algorithm.Algorithm` and any :class:`~rlinf_cli.policy.Policy`:
the algorithm supplies advantages and the loss, the policy ``evaluate``.

With small policies the thousands of tiny gradient steps of a PPO run are bound by Python and
per-op dispatch, not FLOPs, so the step is kept lean: one gather per tensor per epoch (then
contiguous slices), a fused Adam kernel, a multi-tensor gradient clip, and diagnostics summed
as one stacked tensor. The arithmetic is the textbook one; only the number of ops shrinks.
"""

from __future__ import annotations

from typing import Any

import torch

from rlinf_cli.algorithm import Algorithm, MiniBatch
from rlinf_cli.policy import Policy
from rlinf_cli.runtime.rollout import Rollout


def make_optimizer(policy: torch.nn.Module, cfg: Any) -> torch.optim.Optimizer:
    params = [p for p in policy.parameters() if p.requires_grad]
    # one fused kernel for all parameters instead of a Python loop over them (same Adam maths)
    if _fused_ok(params):
        if getattr(cfg, "weight_decay", 0.0):
            return LeanAdamW(params, lr=cfg.lr, eps=1e-5, weight_decay=cfg.weight_decay, fused=True)
        return LeanAdam(params, lr=cfg.lr, eps=1e-5, fused=True)
    if getattr(cfg, "weight_decay", 0.0):
        return torch.optim.AdamW(params, lr=cfg.lr, eps=1e-5, weight_decay=cfg.weight_decay)
    return torch.optim.Adam(params, lr=cfg.lr, eps=1e-5)


class _LeanStep:
    """``step()`` straight into torch's fused Adam kernel for the common case.

    ``torch.optim.Adam(fused=True).step`` spends most of its time for small models in Python
    (hooks, grouping tensors by device, per-parameter checks): ~0.1 ms per step here, against
    ~0.02 ms for the kernel. Once torch's own first step has created the state, later steps
    call the kernel directly with cached lists. Anything unusual (several groups, amsgrad, a
    missing gradient, a closure) goes through torch's step. State dicts are torch's own.
    """

    _decoupled = False

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        cache = getattr(self, "_lean", None)
        group = self.param_groups[0]
        if closure is not None or len(self.param_groups) != 1 or group["amsgrad"] or group["maximize"] \
                or not self.state:
            self._lean = None
            return super().step(closure)  # type: ignore[misc]
        params = group["params"]
        grads = [p.grad for p in params]
        if any(g is None or g.is_sparse for g in grads):
            return super().step(closure)  # type: ignore[misc]
        if cache is None or cache[0] is not params:
            states = [self.state[p] for p in params]
            cache = self._lean = (params, [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                                  [s["step"] for s in states])
        _, exp_avgs, exp_avg_sqs, steps = cache
        beta1, beta2 = group["betas"]
        torch._foreach_add_(steps, 1)
        kernel = torch._fused_adamw_ if self._decoupled else torch._fused_adam_
        with torch.no_grad():
            kernel(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=float(group["lr"]),
                   beta1=float(beta1), beta2=float(beta2), weight_decay=float(group["weight_decay"]),
                   eps=float(group["eps"]), maximize=False, grad_scale=None, found_inf=None)
        return None

    def load_state_dict(self, state_dict: dict) -> None:  # state tensors are replaced: rebuild the cache
        self._lean = None
        super().load_state_dict(state_dict)  # type: ignore[misc]


class LeanAdam(_LeanStep, torch.optim.Adam):
    pass


class LeanAdamW(_LeanStep, torch.optim.AdamW):
    _decoupled = True


def _fused_ok(params: list[torch.Tensor]) -> bool | None:
    """Fused Adam needs floating-point params on one CPU/CUDA device; else torch's default."""
    if not params:
        return None
    devices = {p.device.type for p in params}
    if len(devices) != 1 or devices.pop() not in ("cpu", "cuda") or not all(p.is_floating_point() for p in params):
        return None
    return True


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (same maths: scale by min(1, max_norm / (norm + 1e-6)))
    in three multi-tensor ops; returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def update(
    policy: Policy,
    optimizer: torch.optim.Optimizer | Any,
    algo: Algorithm,
    rollout: Rollout,
    generator: torch.Generator,
    train_actor: bool = True,
) -> dict[str, float]:
    """One training phase on a rollout; returns mean diagnostics.

    ``optimizer`` is a torch optimizer (the lean single-process path) or a training engine
    (``rlinf_cli.runtime.distributed``: ``backward(loss)`` and ``step() -> grad norm``, which
    clips, steps, zeroes and, across processes, averages gradients). Under torchrun every rank
    calls this on its own rollout; the epoch diagnostics that decide early stopping are
    averaged over ranks so that all ranks run the same number of steps.
    ``train_actor=False`` trains the critic only (warming up a critic under a cloned actor).
    """
    engine = optimizer if hasattr(optimizer, "backward") and hasattr(optimizer, "step") \
        and not isinstance(optimizer, torch.optim.Optimizer) else None
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
    params = [p for p in policy.parameters() if p.requires_grad]
    names: list[str] | None = None
    total: torch.Tensor | None = None
    count = 0
    epochs_run = 0
    policy.train()
    for _epoch in range(cfg.epochs):
        epoch_sum: torch.Tensor | None = None
        epoch_count = 0
        perm = torch.randperm(n, generator=generator)
        # one gather per tensor per epoch; minibatches are then free contiguous slices
        e_obs = {k: v[perm] for k, v in obs.items()}
        e_actions = actions[perm]
        e_data = MiniBatch(*(None if t is None else t[perm] for t in data))
        for start in range(0, n, mb_size):
            end = start + mb_size
            out = policy.evaluate({k: v[start:end] for k, v in e_obs.items()}, e_actions[start:end])
            mb = MiniBatch(*(None if t is None else t[start:end] for t in e_data))
            loss, stats = algo.loss(out, mb)
            if not train_actor:
                loss = stats["value_loss_raw"]
            if engine is not None:
                engine.backward(loss)
                norm = engine.step()
                if norm is not None:
                    stats["grad_norm"] = torch.as_tensor(norm, dtype=torch.float32)
            else:
                for p in params:  # optimizer.zero_grad(set_to_none=True) without its profiler scope
                    p.grad = None
                loss.backward()
                if cfg.max_grad_norm is not None:
                    stats["grad_norm"] = clip_grad_norm(params, cfg.max_grad_norm)
                optimizer.step()
            if names is None:
                names = list(stats)
            row = torch.stack([stats[k].detach().reshape(()).float().cpu() if k in stats else torch.tensor(float("nan"))
                               for k in names])
            epoch_sum = row if epoch_sum is None else epoch_sum.add_(row)
            epoch_count += 1
        epochs_run += 1
        total = epoch_sum.clone() if total is None else total.add_(epoch_sum)
        count += epoch_count
        epoch_mean = epoch_sum / epoch_count
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(epoch_mean)  # the same early-stop decision on every rank
            epoch_mean /= torch.distributed.get_world_size()
        epoch_means = dict(zip(names, epoch_mean.tolist()))
        if algo.stop_early(epoch_means):
            break
    policy.eval()
    means = (total / max(count, 1)).tolist() if total is not None else []
    metrics = {f"train/{k}": v for k, v in zip(names or [], means) if not k.endswith("_raw")}
    metrics["train/epochs"] = float(epochs_run)
    metrics["train/samples"] = float(n)
    return metrics
