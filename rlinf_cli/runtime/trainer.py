"""The generic update: advantages once, then epochs of shuffled minibatches.

Works for any :class:`~rlinf_cli.algorithm.Algorithm` and any :class:`~rlinf_cli.policy.Policy`:
the algorithm supplies advantages and the loss, the policy ``evaluate``.

With small policies the thousands of tiny gradient steps of a PPO run are bound by Python and
per-op dispatch, not FLOPs, so the step is kept lean: one gather per tensor per epoch (then
contiguous slices), Adam as a few multi-tensor ops, a multi-tensor gradient clip, and
diagnostics summed as one stacked tensor. The results are bit-identical to the plain loop with
``torch.optim.Adam``; only the number of Python-level ops shrinks.
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
        return LeanAdamW(params, lr=cfg.lr, eps=1e-5, weight_decay=cfg.weight_decay)
    return LeanAdam(params, lr=cfg.lr, eps=1e-5)


# Models up to this many parameters get flat buffers (see _LeanStep); larger ones keep their own.
FLAT_MAX_PARAMS = 4_000_000


class _LeanStep:
    """Adam's step in a handful of tensor ops, bit-identical to ``torch.optim.Adam``.

    For small models ``torch.optim.Adam.step`` is Python-bound: hooks, grouping tensors by
    device, a loop over parameters (~1 ms for a 64x64 actor-critic on a busy 2-core machine).
    After torch's own first step has created the state, a small float32 model's parameters,
    gradients and Adam moments are moved into one flat buffer each (the parameters, gradients
    and state entries become views of them), and Adam runs as 7 elementwise ops on the flat
    buffers. Elementwise arithmetic does not care how tensors are laid out, so the result equals
    torch's per-tensor loop bit for bit (torch's fused kernel does not). Larger models, or
    anything unusual (several param groups, amsgrad, maximize, a closure, a missing gradient,
    several devices or dtypes, parameters with no state yet or a different step count) go through
    torch's step. State dicts are torch's own.
    """

    _decoupled = False

    def zero_grad(self, set_to_none: bool = True) -> None:  # type: ignore[override]
        flat = getattr(self, "_flat", None)
        if flat is None:
            return super().zero_grad(set_to_none)  # type: ignore[misc]
        flat["grad"].zero_()  # in place: the parameters' .grad stay views of the flat buffer
        for p, g in zip(flat["params"], flat["grad_views"]):
            p.grad = g

    def _flatten(self, params: list[torch.Tensor]) -> dict[str, Any] | None:
        if sum(p.numel() for p in params) > FLAT_MAX_PARAMS or len({(p.device, p.dtype) for p in params}) != 1 \
                or params[0].dtype != torch.float32:
            return None
        states = [self.state[p] for p in params]
        if len({float(s["step"]) for s in states}) != 1:
            # parameters that sat out some steps (a critic warm-up without the actor) keep their
            # own bias corrections: torch's per-parameter step handles that
            return None
        sizes = [p.numel() for p in params]

        def flat_of(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
            buf = torch.cat([t.detach().reshape(-1) for t in tensors])
            return buf, [v.view_as(t) for v, t in zip(buf.split(sizes), tensors)]

        with torch.no_grad():
            fp, p_views = flat_of(params)
            fm, m_views = flat_of([s["exp_avg"] for s in states])
            fv, v_views = flat_of([s["exp_avg_sq"] for s in states])
            fg, g_views = flat_of([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
        for p, pv, st, mv, vv in zip(params, p_views, states, m_views, v_views):
            p.data = pv
            st["exp_avg"], st["exp_avg_sq"] = mv, vv
        return {"params": params, "param": fp, "exp_avg": fm, "exp_avg_sq": fv, "grad": fg, "grad_views": g_views,
                "grad_ptrs": [g.data_ptr() for g in g_views], "steps": [s["step"] for s in states]}

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        group = self.param_groups[0]
        params = group["params"]
        flat = getattr(self, "_flat", None)
        if closure is not None or len(self.param_groups) != 1 or group["amsgrad"] or group["maximize"] \
                or len(self.state) < len(params) or group.get("differentiable") or group.get("capturable") \
                or any(p.grad is None or p.grad.is_sparse for p in params):
            self._flat = None
            return super().step(closure)  # type: ignore[misc]
        if flat is None or flat["params"] is not params:
            flat = self._flat = self._flatten(params)
            if flat is None:
                return super().step(closure)  # type: ignore[misc]
        grad = flat["grad"]
        with torch.no_grad():
            for p, g, ptr in zip(params, flat["grad_views"], flat["grad_ptrs"]):
                if p.grad.data_ptr() != ptr:  # someone replaced .grad (set_to_none, an all-reduce): take it in
                    g.copy_(p.grad)
                    p.grad = g
            lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
            beta1, beta2 = (float(b) for b in group["betas"])
            torch._foreach_add_(flat["steps"], 1.0)
            param, exp_avg, exp_avg_sq = flat["param"], flat["exp_avg"], flat["exp_avg_sq"]
            if wd != 0:
                if self._decoupled:
                    param.mul_(1 - lr * wd)
                else:
                    grad = grad.add(param, alpha=wd)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = float(flat["steps"][0].item())  # every parameter has taken the same number of steps
            step_size = (lr / (1 - beta1 ** step)) * -1
            denom = exp_avg_sq.sqrt().div_((1 - beta2 ** step) ** 0.5).add_(eps)
            param.addcdiv_(exp_avg, denom, value=step_size)
        return None

    def load_state_dict(self, state_dict: dict) -> None:  # the state tensors are replaced: flatten anew
        self._flat = None
        super().load_state_dict(state_dict)  # type: ignore[misc]


class LeanAdam(_LeanStep, torch.optim.Adam):
    pass


class LeanAdamW(_LeanStep, torch.optim.AdamW):
    _decoupled = True


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
    ``train_actor=False`` trains the critic only (warming up a critic under a cloned actor): the
    value loss, stepping :meth:`Policy.critic_parameters` alone.
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
    # warm-up: gradients of shared parts (image encoder, task embedding) are dropped, so the
    # optimizer (torch's Adam skips a None gradient) leaves everything the actor reads as it was
    critic = set() if train_actor else {id(p) for p in policy.critic_parameters()}
    frozen = [] if train_actor else [p for p in params if id(p) not in critic]
    # a training engine owns its gradients (partitioned under ZeRO): zero them on the way in
    # instead; a fresh optimizer's moments stay 0, so those parameters do not move either
    hooks = [p.register_hook(torch.zeros_like) for p in frozen] if engine is not None else []
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
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                for p in frozen:
                    p.grad = None
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
    for h in hooks:
        h.remove()
    policy.eval()
    means = (total / max(count, 1)).tolist() if total is not None else []
    metrics = {f"train/{k}": v for k, v in zip(names or [], means) if not k.endswith("_raw")}
    metrics["train/epochs"] = float(epochs_run)
    metrics["train/samples"] = float(n)
    return metrics
