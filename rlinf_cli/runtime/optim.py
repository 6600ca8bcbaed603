"""Adam for many tiny gradient steps: :class:`LeanAdam` (torch's Adam with a fraction of its Python
overhead) and a multi-tensor gradient clip.

With small policies the thousands of tiny gradient steps of a PPO run are bound by Python and
per-op dispatch, not FLOPs: Adam as a few ops on flat buffers (one fused kernel call for larger
models), and the clip as three multi-tensor ops, cut that overhead.
"""

from __future__ import annotations

from typing import Any

import torch


# Models up to this many parameters get flat buffers (see _LeanStep); larger ones keep their own.
FLAT_MAX_PARAMS = 4_000_000
# From this many parameters the flat buffers take torch's fused Adam kernel (see _LeanStep).
# Smaller models keep the seven-op step, bit-identical to torch.optim.Adam: the kernel saves ~20 us
# a step there (31 -> 12 us at 10k parameters, ~1% of a PPO minibatch), and the PPO CartPole
# learning test's seed, run with it, ended at 324 instead of >= 475; until several seeds show the
# kernel's rounding changes nothing systematic, small models keep the numbers they were tested with.
FUSED_MIN_PARAMS = 100_000


def _undecorated(name: str) -> Any:
    """torch wraps some Optimizer methods in ``torch._disable_dynamo``, whose first call imports
    ``torch._dynamo`` (~1.3 s, a third of a small run's start). rlinf never compiles its
    optimizer, so LeanAdam calls them unwrapped (the same functions; any torch without the
    wrapper gives the method itself)."""
    fn = getattr(torch.optim.Optimizer, name)
    return getattr(fn, "__wrapped__", fn)


def _scalar_dtype() -> torch.dtype:  # what torch's Adam gives its per-parameter ``step``
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class _LeanStep:
    """Adam's step on flat buffers: torch's Adam bit for bit, or its fused kernel for larger models.

    For small models ``torch.optim.Adam.step`` is Python-bound: hooks, grouping tensors by
    device, a loop over parameters (~1 ms for a 64x64 actor-critic on a busy 2-core machine).
    After torch's own first step has created the state, a small float32 model's parameters,
    gradients and Adam moments are moved into one flat buffer each (the parameters, gradients
    and state entries become views of them). From ``FUSED_MIN_PARAMS`` parameters on, Adam runs
    as torch's fused Adam kernel on the flat buffers: one pass over memory, which matters once the
    buffers outgrow the core's cache (SAC's 256-wide networks); it agrees with torch's fused Adam
    on the separate tensors to float rounding (the kernel's scalar tails fall on other elements).
    Below that, or where torch has no fused kernel for the device, 7 elementwise ops on the flat
    buffers give torch's default per-tensor Adam bit for bit (elementwise arithmetic does not care
    how tensors are laid out). The first step creates
    Adam's state as torch's would (zeros, step 0) and takes the same path. Larger models, or
    anything unusual (several param groups, amsgrad, maximize, a closure, a missing gradient,
    several devices or dtypes, only some parameters with state, a different step count) go
    through torch's step. State dicts are torch's own.
    """

    _decoupled = False
    add_param_group = _undecorated("add_param_group")
    state_dict = _undecorated("state_dict")

    def zero_grad(self, set_to_none: bool = True) -> None:  # type: ignore[override]
        flat = getattr(self, "_flat", None)
        if flat is None:
            return _undecorated("zero_grad")(self, set_to_none)
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
            # the step counts too: one add a step instead of one per parameter (each state keeps a
            # 0-d view, so torch's own step and state dicts see per-parameter counts as before)
            fs = torch.stack([s["step"].detach().reshape(()) for s in states])
        for i, (p, pv, st, mv, vv) in enumerate(zip(params, p_views, states, m_views, v_views)):
            p.data = pv
            st["exp_avg"], st["exp_avg_sq"], st["step"] = mv, vv, fs[i]
        return {"params": params, "param": fp, "exp_avg": fm, "exp_avg_sq": fv, "grad": fg, "grad_views": g_views,
                "grad_ptrs": [g.data_ptr() for g in g_views], "steps": fs}

    def _flat_eligible(self, params: list[torch.Tensor]) -> bool:
        """Whether the flat path may take this step (else torch's own step runs)."""
        group = self.param_groups[0]
        return not (len(self.param_groups) != 1 or group["amsgrad"] or group["maximize"]
                    or 0 < len(self.state) < len(params) or group.get("differentiable") or group.get("capturable")
                    or group.get("fused") or any(p.grad is None or p.grad.is_sparse for p in params))

    def flat_grad(self) -> torch.Tensor | None:
        """All gradients as one flat buffer (the parameters' ``.grad`` are views of it), or None
        where the flat path is not set up or a parameter has no gradient. Gradients someone
        replaced (an all-reduce) are copied in first. For clipping with one norm and one scale."""
        flat = getattr(self, "_flat", None)
        params = self.param_groups[0]["params"]
        if flat is None or flat["params"] is not params:  # as step() would set it up (after a resume too)
            if not self.state or not self._flat_eligible(params):
                return None
            flat = self._flat = self._flatten(params)
            if flat is None:
                return None
        return flat["grad"] if _adopt_grads(flat) else None

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        group = self.param_groups[0]
        params = group["params"]
        flat = getattr(self, "_flat", None)
        if closure is not None or not self._flat_eligible(params):
            self._flat = None
            return super().step(closure)  # type: ignore[misc]
        if not self.state:  # the first step: Adam's lazy state, as torch's step would create it
            for p in params:
                self.state[p] = {"step": torch.tensor(0.0, dtype=_scalar_dtype()),
                                 "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                 "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        if flat is None or flat["params"] is not params:
            flat = self._flat = self._flatten(params)
            if flat is None:
                return super().step(closure)  # type: ignore[misc]
        grad = flat["grad"]
        _adopt_grads(flat)
        with torch.no_grad():
            lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
            beta1, beta2 = (float(b) for b in group["betas"])
            flat["steps"].add_(1.0)
            param, exp_avg, exp_avg_sq = flat["param"], flat["exp_avg"], flat["exp_avg_sq"]
            fused = _fused_kernel(self._decoupled, param.device.type) if param.numel() >= FUSED_MIN_PARAMS else None
            if fused is not None:
                # one pass over the four buffers instead of seven: once they outgrow the core's
                # cache (SAC's 256x256 actor and twin critics, 210k parameters, 3.4 MB) the
                # separate ops each stream them from L3 (426 -> 179 us at 210k in isolation; in a
                # SAC run, where the env step evicts them, Adam was 13% of the time under py-spy)
                fused([param], [grad], [exp_avg], [exp_avg_sq], [], [flat["steps"][0]], amsgrad=False, lr=lr,
                      beta1=beta1, beta2=beta2, weight_decay=wd, eps=eps, maximize=False)
                return None
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
        _undecorated("load_state_dict")(self, state_dict)


def _adopt_grads(flat: dict[str, Any]) -> bool:
    """Point every parameter's ``.grad`` back at its view of the flat buffer, copying in gradients
    someone replaced (set_to_none, an all-reduce); False if a parameter has no gradient."""
    with torch.no_grad():
        for p, g, ptr in zip(flat["params"], flat["grad_views"], flat["grad_ptrs"]):
            if p.grad is None:
                return False
            if p.grad.data_ptr() != ptr:
                g.copy_(p.grad)
                p.grad = g
    return True


def _fused_kernel(decoupled: bool, device: str) -> Any:
    """torch's fused Adam (AdamW) kernel for ``device``, or None where this torch lacks one."""
    if device not in ("cpu", "cuda"):
        return None
    return getattr(torch, "_fused_adamw_" if decoupled else "_fused_adam_", None)


class LeanAdam(_LeanStep, torch.optim.Adam):
    pass


class LeanAdamW(_LeanStep, torch.optim.AdamW):
    _decoupled = True


def clip_grad_norm(params: list[torch.Tensor], max_norm: float, flat: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (same maths: scale by min(1, max_norm / (norm + 1e-6)))
    in three multi-tensor ops, or with ``flat`` (every gradient, as :meth:`_LeanStep.flat_grad`
    gives it) in one norm and one scale (equal to rounding: one sum instead of a norm of norms);
    returns the norm before clipping."""
    if flat is not None:
        norm = torch.linalg.vector_norm(flat)
        flat.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm
