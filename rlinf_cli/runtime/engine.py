"""Training engines: who owns the optimizer step, in one process or many, torch or DeepSpeed.

Every stage trains through one interface::

    engine = make_engine(policy, algo.optim, cfg.train, accelerator)
    engine.schedule(fraction_of_the_run_done)   # the algorithm's learning-rate schedule (OptimSpec.schedule)
    with engine.autocast():                     # train.bf16: the forward pass in bf16 (else no-op)
        loss = ...                              # forward through engine.module (the policy)
    engine.backward(loss)
    grad_norm = engine.step()                   # clip, optimizer step, zero grads
    engine.save(checkpoint_dir) / engine.load(checkpoint_dir)

The engine decides nothing about optimisation itself: Adam's ``eps``, the learning rate and its
schedule, the gradient-norm clip and weight decay are what the algorithm declares
(:class:`~rlinf_cli.algorithm.OptimSpec`, ``Algorithm.optim``); the engine decides only how to run
them fast on its backend.

- ``train.backend=torch`` (default): :class:`TorchEngine`. Small models (up to 4M parameters,
  every embodied policy) step with :class:`~rlinf_cli.runtime.optim.LeanAdam` on flat buffers, at
  a fraction of ``torch.optim.Adam``'s Python cost (bit-identical to it below 100k parameters,
  torch's fused kernel above); larger ones (language models) with torch's fused Adam kernel.
  Under ``torchrun`` gradients are all-reduced each step (rank helpers: :mod:`~rlinf_cli.runtime.dist`).
  ``train.bf16=true``: mixed precision (:mod:`~rlinf_cli.runtime.precision`), the forward pass
  (and with it the backward pass) under ``torch.autocast(bfloat16)``, or, on a CPU whose oneDNN
  has bf16 kernels and for a policy without convolutions, oneDNN's bf16 math on fp32 tensors
  (where it measurably rounds the model's hidden layers). ``auto`` is fp32 with this backend on
  every device: bf16 has not been shown to leave learning unaffected for the small policies it
  trains (docs/algorithms.md).
- ``train.backend=deepspeed``: :class:`DeepSpeedEngine`, ZeRO ``train.zero_stage`` (0-3), bf16
  where the accelerator supports it, ``torch_adam`` (DeepSpeed's fused Adam ops would JIT-compile
  for minutes on a CPU). Its optimizer state is saved and restored with DeepSpeed's own
  checkpoint files (one shard per rank), so DeepSpeed runs resume too.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from rlinf_cli.algorithm import OptimSpec
from rlinf_cli.errors import UserError, torch_load_error
from rlinf_cli.runtime.dist import free_port, world
from rlinf_cli.runtime.optim import FLAT_MAX_PARAMS, LeanAdam, LeanAdamW, clip_grad_norm
from rlinf_cli.runtime.precision import (PROBE_BATCH, bf16_setting, hidden_shapes, onednn_bf16_available,
                                         onednn_bf16_matmuls, onednn_bf16_rounds)

BACKENDS = ("torch", "deepspeed")
OPTIM_FILE = "optimizer.pt"
DEEPSPEED_DIR = "deepspeed"


class Engine:
    """Policy + optimizer on a backend. ``module`` is the (unwrapped) policy to call."""

    backend = ""

    bf16 = False  # autocast the forward pass to bf16 (TorchEngine with train.bf16=true)
    onednn_bf16 = False  # train.bf16 as oneDNN's bf16 math on fp32 tensors instead (TorchEngine, CPU)
    onednn_fallback: str | None = None  # why oneDNN's bf16 math was available but not used (measured)

    @property
    def precision(self) -> str:
        """What precision the training matrix products really run in, for the run's params:
        ``fp32``, ``bf16-onednn`` (bf16-rounded inputs, fp32 tensors) or ``bf16-autocast``."""
        if not self.bf16:
            return "fp32"
        return "bf16-onednn" if self.onednn_bf16 else "bf16-autocast"

    def __init__(self, module: torch.nn.Module, optim: OptimSpec):
        self.module = module
        self.optim = optim
        self.rank, self.world_size = world()
        self.params = [p for p in module.parameters() if p.requires_grad]
        self._frozen: list[torch.Tensor] = []

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context the training forward pass and loss are computed in: bf16 autocast when
        this engine trains in mixed precision, otherwise nothing. The backward pass needs no
        context: autograd replays the dtypes the forward pass recorded."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def step(self) -> torch.Tensor | None:
        """Clip gradients, update, zero gradients; returns the pre-clip gradient norm when known."""
        raise NotImplementedError

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def schedule(self, done: float) -> None:
        """The algorithm's learning-rate schedule (``OptimSpec.schedule``), in the one unit every
        stage shares: the fraction of the run done (rl: of its step budget; sft: of its epochs).
        Without one the rate is left alone (a critic warm-up may have set its own)."""
        if self.optim.schedule is not None:
            self.set_lr(self.optim.lr * self.optim.schedule(done))

    @contextlib.contextmanager
    def freeze(self, params: Sequence[torch.Tensor]) -> Iterator[None]:
        """Inside: ``params`` get no update (a critic warm-up leaves what the actor reads alone)."""
        self._frozen = list(params)
        try:
            yield
        finally:
            self._frozen = []

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[None]:
        """Inside: every parameter is whole on every rank (ZeRO-3 gathers them), e.g. to save."""
        yield

    def save(self, path: Path) -> None:
        """Write the optimizer state into checkpoint directory ``path`` (every rank calls it)."""
        if self.rank == 0:
            torch.save(self.optimizer.state_dict(), Path(path) / OPTIM_FILE)

    def load(self, path: Path) -> None:
        """Restore what :meth:`save` wrote (loaded with ``weights_only=True``: no code runs)."""
        f = Path(path) / OPTIM_FILE
        if not f.is_file():
            raise UserError(f"'{path}' cannot be resumed: it lacks {OPTIM_FILE} (only rl training checkpoints resume)")
        try:
            self.optimizer.load_state_dict(torch.load(f, weights_only=True, map_location="cpu"))
        except Exception as exc:  # any damage means the same thing to the user; pickle is refused, never advised
            raise UserError(torch_load_error(path, OPTIM_FILE, exc)) from exc

    def close(self) -> None:
        pass


class TorchEngine(Engine):
    """torch's autograd and Adam, in one process or under torchrun (gradients all-reduced)."""

    backend = "torch"

    def __init__(self, module: torch.nn.Module, optim: OptimSpec, bf16: bool = False):
        super().__init__(module, optim)
        self.optimizer = self._optimizer()
        # LeanAdam keeps every gradient in one flat buffer: the clip's norm is then one reduction
        # over it (clip_grad_norm); torch's optimizers have none and the clip walks the tensors
        self._flat_grad: Callable[[], torch.Tensor | None] = getattr(self.optimizer, "flat_grad", lambda: None)
        self.bf16 = bool(bf16)
        self._device_type = self.params[0].device.type if self.params else "cpu"
        # CPU, no convolutions: oneDNN's bf16 math on fp32 tensors instead of autocast (module docstring),
        # where it measurably rounds this model's hidden layers; otherwise autocast, whose bf16 tensors
        # round by construction
        self.onednn_bf16 = (self.bf16 and self._device_type == "cpu" and onednn_bf16_available()
                            and not any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in module.modules()))
        if self.onednn_bf16:
            hidden = hidden_shapes(module)
            unrounded = onednn_bf16_rounds(hidden) if hidden else []
            if not hidden or unrounded:
                self.onednn_bf16 = False
                what = ", ".join(f"{k}x{n}" for k, n in unrounded[:3]) or "no hidden linear layers"
                self.onednn_fallback = (f"this CPU's oneDNN keeps these layers' products in full fp32 under its bf16 "
                                        f"math mode ({what}, measured at batch {PROBE_BATCH})")

    def autocast(self) -> contextlib.AbstractContextManager:
        if not self.bf16:
            return contextlib.nullcontext()
        if self.onednn_bf16:
            return onednn_bf16_matmuls()
        # the weights stay fp32 (the optimizer's master copy); autocast casts them per matmul and
        # caches the casts of leaf parameters until the context exits, once per gradient step
        return torch.autocast(self._device_type, dtype=torch.bfloat16)

    def _optimizer(self) -> torch.optim.Optimizer:
        """Adam (AdamW with weight decay) as the algorithm declared it; only the implementation is
        the engine's choice."""
        o = self.optim
        kwargs = {"weight_decay": o.weight_decay} if o.weight_decay else {}
        if sum(p.numel() for p in self.params) <= FLAT_MAX_PARAMS:
            cls = LeanAdamW if o.weight_decay else LeanAdam
            return cls(self.params, lr=o.lr, eps=o.eps, **kwargs)
        # large models: torch's fused kernel (about 3x faster steps than the per-tensor loop on CPU)
        kind = torch.optim.AdamW if o.weight_decay else torch.optim.Adam
        fused = all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.bfloat16) for p in self.params)
        try:
            return kind(self.params, lr=o.lr, eps=o.eps, fused=fused, **kwargs)
        except (RuntimeError, TypeError):  # a torch without fused kernels for this device
            return kind(self.params, lr=o.lr, eps=o.eps, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        if self.onednn_bf16:  # the backward pass's products too (autocast's are replayed by autograd)
            with onednn_bf16_matmuls():
                loss.backward()
        else:
            loss.backward()
        for p in self._frozen:  # Adam skips a parameter without a gradient: it does not move
            p.grad = None

    def step(self) -> torch.Tensor | None:
        if self.world_size > 1:  # average gradients over processes, one flat buffer
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
            flat = torch.cat([g.reshape(-1) for g in grads])
            torch.distributed.all_reduce(flat)
            flat /= self.world_size
            offset = 0
            for p, g in zip(self.params, grads):
                n = g.numel()
                p.grad = flat[offset:offset + n].view_as(p)
                offset += n
            for p in self._frozen:
                p.grad = None
        norm = None
        if self.optim.max_grad_norm is not None:  # the algorithm's clip (OptimSpec.max_grad_norm)
            norm = clip_grad_norm(self.params, self.optim.max_grad_norm, self._flat_grad())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm


class DeepSpeedEngine(Engine):
    backend = "deepspeed"

    def __init__(self, module: torch.nn.Module, optim: OptimSpec, zero_stage: int, bf16: bool, accelerator: Any):
        super().__init__(module, optim)
        if accelerator is not None and hasattr(accelerator, "prepare_deepspeed"):
            accelerator.prepare_deepspeed()  # DS_ACCELERATOR: DeepSpeed's own detection probes CUDA first
        try:
            import deepspeed
        except ImportError as exc:
            raise UserError("train.backend=deepspeed needs DeepSpeed: pip install 'rlinf-cli[deepspeed]'") from exc
        on_cpu = accelerator is None or accelerator.device().type == "cpu"
        if on_cpu:  # DeepSpeed JIT-compiles a shared-memory comm op (~3 min) on CPU; gloo does that job
            import deepspeed.ops

            getattr(deepspeed.ops, "__compatible_ops__", {})["deepspeed_shm_comm"] = False
        if not torch.distributed.is_initialized():
            for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
                os.environ.setdefault(key, value)
            os.environ.setdefault("MASTER_PORT", str(free_port()))
            deepspeed.init_distributed(dist_backend=accelerator.dist_backend() if accelerator else "gloo")
        self.rank, self.world_size = world()
        config = {
            "train_micro_batch_size_per_gpu": 1,  # the loop feeds its own minibatches; these only satisfy checks
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW" if optim.weight_decay else "Adam",
                          "params": {"lr": float(optim.lr), "eps": float(optim.eps),
                                     "weight_decay": float(optim.weight_decay), "torch_adam": True}},
            "zero_optimization": {"stage": int(zero_stage)},
            "bf16": {"enabled": bool(bf16)},
            "gradient_clipping": float(optim.max_grad_norm) if optim.max_grad_norm else 0.0,
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=module, model_parameters=self.params, config=config)
        self.zero_stage = int(zero_stage)
        self.ds_bf16 = bool(bf16)  # DeepSpeed's own bf16 (weights in bf16, fp32 master copy)
        self._hooks: list[Any] = []

    @property
    def precision(self) -> str:
        return "bf16-deepspeed" if self.ds_bf16 else "fp32"

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> torch.Tensor | None:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else torch.as_tensor(float(norm))

    @contextlib.contextmanager
    def freeze(self, params: Sequence[torch.Tensor]) -> Iterator[None]:
        # ZeRO owns (partitions) the gradients: zero them on their way in; a fresh optimizer's
        # moments stay 0, so those parameters do not move either
        hooks = [p.register_hook(torch.zeros_like) for p in params]
        try:
            yield
        finally:
            for h in hooks:
                h.remove()

    @contextlib.contextmanager
    def full_parameters(self) -> Iterator[None]:
        if self.zero_stage < 3:
            yield
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            yield

    def save(self, path: Path) -> None:
        # DeepSpeed's own files: one optimizer shard per rank (a collective call)
        self.engine.save_checkpoint(str(Path(path) / DEEPSPEED_DIR), tag="state", save_latest=False)

    def load(self, path: Path) -> None:
        d = Path(path) / DEEPSPEED_DIR
        if not (d / "state").is_dir():
            raise UserError(f"'{path}' cannot be resumed with train.backend=deepspeed: it has no {DEEPSPEED_DIR}/ "
                            f"state (written by train.backend=torch?); resume with the backend that wrote it")
        loaded, _ = self.engine.load_checkpoint(str(d), tag="state", load_optimizer_states=True,
                                                load_lr_scheduler_states=False)
        if loaded is None:
            raise UserError(f"cannot resume from '{path}': DeepSpeed could not read {d / 'state'}")


def make_engine(policy: torch.nn.Module, optim: OptimSpec, train_cfg: Any, accelerator: Any = None) -> Engine:
    """The engine ``train.backend`` names (``torch`` when the key is absent)."""
    get = (lambda k, d: train_cfg.get(k, d)) if hasattr(train_cfg, "get") else (lambda k, d: getattr(train_cfg, k, d))
    backend = str(get("backend", "torch") or "torch")
    if backend not in BACKENDS:
        raise UserError(f"train.backend must be one of {', '.join(BACKENDS)}, got '{backend}'")
    bf16 = bf16_setting(get("bf16", "auto"))
    if backend == "torch":
        return TorchEngine(policy, optim, bf16=bf16 is True)  # auto: fp32 (see the module docstring)
    stage = int(get("zero_stage", 2))
    if stage not in (0, 1, 2, 3):
        raise UserError(f"train.zero_stage must be 0, 1, 2 or 3, got {stage}")
    supports = bool(accelerator.supports_bf16()) if accelerator is not None else False
    on_cpu = accelerator is None or accelerator.device().type == "cpu"
    use_bf16 = (supports and not on_cpu) if bf16 == "auto" else bf16
    return DeepSpeedEngine(policy, optim, stage, bool(use_bf16), accelerator)
