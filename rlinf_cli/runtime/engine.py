"""Training engines: who owns the optimizer step, in one process or many, torch or DeepSpeed.

Every stage trains through one interface::

    engine = make_engine(policy, algo.optim, cfg.train, accelerator)
    engine.schedule(fraction_of_the_run_done)   # the one learning-rate schedule (linear anneal)
    with engine.autocast():                     # train.bf16: the forward pass in bf16 (else no-op)
        loss = ...                              # forward through engine.module (the policy)
    engine.backward(loss)
    grad_norm = engine.step()                   # clip, optimizer step, zero grads
    engine.save(checkpoint_dir) / engine.load(checkpoint_dir)

- ``train.backend=torch`` (default): :class:`TorchEngine`. Small models (up to 4M parameters,
  every embodied policy) step with :class:`~rlinf_cli.runtime.optim.LeanAdam` on flat buffers, at
  a fraction of ``torch.optim.Adam``'s Python cost (bit-identical to it below 100k parameters,
  torch's fused kernel above); larger ones (language models) with torch's fused Adam kernel.
  Under ``torchrun`` gradients are all-reduced each step.
  ``train.bf16=true``: mixed precision, the forward pass (and with it the backward pass) under
  ``torch.autocast(bfloat16)``, so matrix products run in bf16 while the weights, their gradients,
  the optimizer state and everything autocast keeps in fp32 stay fp32 (the MLP model also runs its
  output layer in fp32: Q values, means, log stds and logits feed losses and log-probs). On a CPU
  whose oneDNN has bf16 kernels, a policy without convolutions instead keeps every tensor fp32 and
  lets oneDNN compute the fp32 matrix products from bf16-rounded inputs with fp32 accumulation
  (torch's ``mkldnn.matmul.fp32_precision = "bf16"``, set for the forward and backward passes
  only): the same bf16 products without autocast's per-step casts of weights and activations or
  bf16 elementwise ops: 7.6 vs 8.6 ms per SAC step (256x256, batch 256; benchmarks/sac_step.py).
  Convolutions stay with autocast, whose bf16 kernels beat oneDNN's fp32 mode there (30 vs 38 ms
  for a two-layer encoder's forward and backward at batch 256, measured).
  ``auto`` is fp32 with this backend on every device: bf16 has not been shown to leave learning
  unaffected for the small policies it trains (docs/algorithms.md).
- ``train.backend=deepspeed``: :class:`DeepSpeedEngine`, ZeRO ``train.zero_stage`` (0-3), bf16
  where the accelerator supports it, ``torch_adam`` (DeepSpeed's fused Adam ops would JIT-compile
  for minutes on a CPU). Its optimizer state is saved and restored with DeepSpeed's own
  checkpoint files (one shard per rank), so DeepSpeed runs resume too.

On CPU the process group uses gloo.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from rlinf_cli.errors import UserError, torch_load_error
from rlinf_cli.runtime.optim import FLAT_MAX_PARAMS, LeanAdam, LeanAdamW, clip_grad_norm

BACKENDS = ("torch", "deepspeed")
BF16_VALUES = ("auto", "true", "false")
OPTIM_FILE = "optimizer.pt"
DEEPSPEED_DIR = "deepspeed"


@dataclass(frozen=True)
class OptimSpec:
    """The optimisation settings an algorithm declares (see ``Algorithm.optim``)."""

    lr: float
    anneal_lr: bool = False  # linear decay to 0 over the run
    max_grad_norm: float | None = None
    weight_decay: float = 0.0


# -- process group ------------------------------------------------------------------------------
def world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` outside torchrun."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def setup_ranks(cfg: Any, accelerator: Any) -> tuple[int, int]:
    """Join torchrun's process group when there is one (or DeepSpeed needs one); every rank but 0
    trains quietly and keeps its files out of the run directory. Returns ``(rank, world)``."""
    import tempfile

    backend = str((cfg.get("train") or {}).get("backend", "torch") or "torch")
    if backend == "torch" and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    rank, size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if size > 1 and not torch.distributed.is_initialized():
        if hasattr(accelerator, "set_device"):
            accelerator.set_device()  # LOCAL_RANK -> this process's device, before nccl/hccl bind to one
        torch.distributed.init_process_group(backend=accelerator.dist_backend())
    if rank > 0:
        cfg.tracking.enabled = False
        cfg.progress = False
        cfg.quiet = True
        cfg.run_dir = tempfile.mkdtemp(prefix=f"rlinf-rank{rank}-")
    return rank, size


def gather_to_first(obj: Any) -> list[Any]:
    """Every rank's ``obj``, as a list on rank 0 (``[]`` elsewhere); ``[obj]`` in one process."""
    rank, size = world()
    if size <= 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [obj]
    out: list[Any] | None = [None] * size if rank == 0 else None
    torch.distributed.gather_object(obj, out, dst=0)
    return out or []


def broadcast_from_first(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (a decision only rank 0 can take); ``obj`` in one process."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()) or world()[1] <= 1:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def shutdown() -> None:
    """Barrier and destroy the process group (without it, rank 1 can abort at exit)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


# -- engines --------------------------------------------------------------------------------------
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
        """The learning-rate schedule, in the one unit every stage shares: the fraction of the
        run done (rl: of its step budget; sft: of its epochs)."""
        if self.optim.anneal_lr:
            self.set_lr(self.optim.lr * max(1.0 - done, 0.0))

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


def onednn_bf16_available() -> bool:
    """Whether this torch can run fp32 matrix products on this CPU with bf16 inputs and fp32
    accumulation (oneDNN's bf16 math mode: the ``mkldnn.matmul.fp32_precision`` flag and a CPU
    oneDNN has bf16 kernels for)."""
    try:
        return bool(torch.backends.mkldnn.is_available() and hasattr(torch.backends.mkldnn.matmul, "fp32_precision")
                    and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# torch.backends.mkldnn.matmul.fp32_precision's own getter and setter, called directly: an MLP
# switches the flag around its first and output layers, 16 times per SAC gradient step, and the
# property (a __getattr__ fallback) inside a generator context manager cost ~6 us a switch (~1.5%
# of the step) against ~2 us for this class (measured, this CPU)
_GET_PRECISION = getattr(torch._C, "_get_fp32_precision_getter", None)
_SET_PRECISION = getattr(torch._C, "_set_fp32_precision_setter", None)


# the smallest minibatch the probe assumes: a layer whose products round at this batch size rounds at
# the larger ones rlinf trains with (oneDNN takes its bf16 path for larger problems, not smaller)
PROBE_BATCH = 64
# layers narrower than this on either side are a model's input or output layers, which the MLP keeps
# in full fp32 on purpose (fp32_matmuls), and oneDNN may compute such thin products in fp32 anyway
PROBE_MIN_WIDTH = 16
# a product counts as rounded to bf16 only if it moved by more than this share of its largest value
# (bf16 keeps 8 bits: ~4e-3 per input; fp32's kernel-to-kernel differences are ~1e-7)
BF16_SCALE = 1e-4


def onednn_bf16_rounds(shapes: Sequence[tuple[int, int]], batch: int = PROBE_BATCH) -> list[tuple[int, int]]:
    """The ``(in_features, out_features)`` shapes among ``shapes`` whose fp32 products oneDNN's
    bf16 math mode leaves in full fp32 on this CPU, measured: the flag is a permission, not an
    order, and whether oneDNN takes it depends on the CPU and the problem size (a 2-core Zen 4
    rounded a 256x256 product but not a 64x32x32 one; with ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``
    a Sapphire Rapids rounds none, although ``_is_mkldnn_bf16_supported()`` says yes; with
    ``MKL_CBWR=COMPATIBLE`` as well, the flag moves products to oneDNN's fp32 kernels, which differ
    from MKL's in the last bits only: not rounding). Empty: every shape rounds."""
    g = torch.Generator().manual_seed(0)
    unrounded = []
    for k, n in dict.fromkeys(shapes):
        a = torch.randn(batch, k, generator=g)
        w = torch.randn(n, k, generator=g)
        b = torch.randn(n, generator=g)
        grad = torch.randn(batch, n, generator=g)
        # every product a layer's step makes, each its own kernel choice (measured: with
        # MKL_CBWR=COMPATIBLE a plain product rounded while the biased one, addmm, did not)
        products = (lambda: torch.nn.functional.linear(a, w, b), lambda: torch.nn.functional.linear(a, w),
                    lambda: grad @ w, lambda: grad.t() @ a)
        with torch.no_grad():
            for product in products:
                with _fp32_matmul_precision("none"):
                    full = product()
                with _fp32_matmul_precision("bf16"):
                    rounded = product()
                # bf16's rounding moves a product by ~1e-3 of its scale; another fp32 kernel (oneDNN's
                # instead of MKL's, with the flag on and no bf16 kernel taking it) only in the last bits
                if (rounded - full).abs().max() <= BF16_SCALE * full.abs().max():
                    unrounded.append((k, n))
                    break
    return unrounded


def _hidden_shapes(module: torch.nn.Module) -> list[tuple[int, int]]:
    """The linear layers of ``module`` wide enough on both sides to be hidden layers."""
    return [(m.in_features, m.out_features) for m in module.modules() if isinstance(m, torch.nn.Linear)
            and min(m.in_features, m.out_features) >= PROBE_MIN_WIDTH]


def _matmul_precision() -> str:
    if _GET_PRECISION is not None:
        return _GET_PRECISION("mkldnn", "matmul")
    return getattr(torch.backends.mkldnn.matmul, "fp32_precision", "none")


def _set_matmul_precision(mode: str) -> None:
    if _SET_PRECISION is not None:
        _SET_PRECISION("mkldnn", "matmul", mode)
    else:
        torch.backends.mkldnn.matmul.fp32_precision = mode


class _fp32_matmul_precision:  # noqa: N801 (used as a function)
    """Inside: oneDNN's fp32 matmul precision set to ``mode``; restored on leaving."""

    __slots__ = ("mode", "before")

    def __init__(self, mode: str):
        self.mode = mode

    def __enter__(self) -> None:
        self.before = _matmul_precision()
        _set_matmul_precision(self.mode)

    def __exit__(self, *exc: object) -> None:
        _set_matmul_precision(self.before)


def onednn_bf16_matmuls() -> contextlib.AbstractContextManager:
    """Inside: fp32 matrix products on CPU take bf16-rounded inputs, accumulate and return fp32."""
    return _fp32_matmul_precision("bf16")


def onednn_bf16_active() -> bool:
    """Whether fp32 matrix products on CPU run in oneDNN's bf16 math mode right now (the engine's
    ``train.bf16`` for convolution-free policies on CPU)."""
    return _matmul_precision() == "bf16"


def fp32_matmuls() -> contextlib.AbstractContextManager:
    """Inside: fp32 matrix products in full fp32, also under :func:`onednn_bf16_matmuls` (a model's
    first and output layers: raw observations in, Q values and log stds out)."""
    return _fp32_matmul_precision("none")


def mixed_precision_active(device_type: str = "cpu") -> bool:
    """Whether code runs under the engine's mixed precision, in either of its forms."""
    if torch.is_autocast_enabled(device_type):
        return True
    return device_type == "cpu" and onednn_bf16_active()


class TorchEngine(Engine):
    """torch's autograd and Adam, in one process or under torchrun (gradients all-reduced)."""

    backend = "torch"

    def __init__(self, module: torch.nn.Module, optim: OptimSpec, bf16: bool = False):
        super().__init__(module, optim)
        self.optimizer = self._optimizer()
        self.bf16 = bool(bf16)
        self._device_type = self.params[0].device.type if self.params else "cpu"
        # CPU, no convolutions: oneDNN's bf16 math on fp32 tensors instead of autocast (module docstring),
        # where it measurably rounds this model's hidden layers; otherwise autocast, whose bf16 tensors
        # round by construction
        self.onednn_bf16 = (self.bf16 and self._device_type == "cpu" and onednn_bf16_available()
                            and not any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in module.modules()))
        if self.onednn_bf16:
            hidden = _hidden_shapes(module)
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
        o = self.optim
        if sum(p.numel() for p in self.params) <= FLAT_MAX_PARAMS:
            cls = LeanAdamW if o.weight_decay else LeanAdam
            return cls(self.params, lr=o.lr, eps=1e-5, **({"weight_decay": o.weight_decay} if o.weight_decay else {}))
        # large models: torch's fused kernel (about 3x faster steps than the per-tensor loop on CPU)
        kind = torch.optim.AdamW if o.weight_decay else torch.optim.Adam
        kwargs = {"weight_decay": o.weight_decay} if o.weight_decay else {}
        fused = all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.bfloat16) for p in self.params)
        try:
            return kind(self.params, lr=o.lr, eps=1e-5, fused=fused, **kwargs)
        except (RuntimeError, TypeError):  # a torch without fused kernels for this device
            return kind(self.params, lr=o.lr, eps=1e-5, **kwargs)

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
        if self.optim.max_grad_norm is not None:
            flat = self.optimizer.flat_grad() if isinstance(self.optimizer, (LeanAdam, LeanAdamW)) else None
            norm = clip_grad_norm(self.params, self.optim.max_grad_norm, flat)
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
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            deepspeed.init_distributed(dist_backend=accelerator.dist_backend() if accelerator else "gloo")
        self.rank, self.world_size = world()
        config = {
            "train_micro_batch_size_per_gpu": 1,  # the loop feeds its own minibatches; these only satisfy checks
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW" if optim.weight_decay else "Adam",
                          "params": {"lr": float(optim.lr), "eps": 1e-5, "weight_decay": float(optim.weight_decay),
                                     "torch_adam": True}},
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def bf16_setting(value: Any) -> bool | str:
    """``train.bf16`` as ``True``, ``False`` or ``"auto"`` (null counts as auto); anything else
    is refused rather than read as truthy (``bf16=yes`` must not silently mean something)."""
    if value is None or value is True or value is False:
        return "auto" if value is None else value
    text = str(value).strip().lower()
    if text not in BF16_VALUES:
        raise UserError(f"train.bf16 must be one of {', '.join(BF16_VALUES)}, got '{value}'")
    return "auto" if text == "auto" else text == "true"


def precision_note(engine: Engine) -> str | None:
    """One line for the run's log when the engine trains in mixed precision (else None), with a
    warning where the CPU lacks bf16 matrix instructions: oneDNN then emulates bf16 products and
    they are slower than fp32, the opposite of what the setting is for."""
    if not engine.bf16:
        return None
    if engine.onednn_bf16:
        line = ("train.bf16=true: matrix products from bf16-rounded inputs with fp32 accumulation (oneDNN); "
                "weights, activations, gradients and optimizer in fp32")
    else:
        line = "train.bf16=true: forward and backward passes under bf16 autocast (weights, gradients and optimizer in fp32)"
        if engine.onednn_fallback:
            line = f"train.bf16=true: {engine.onednn_fallback}; bf16 autocast instead (weights, gradients and optimizer in fp32)"
    if engine.params and engine.params[0].device.type == "cpu":
        try:
            flags = Path("/proc/cpuinfo").read_text()
        except OSError:
            flags = None
        if flags is not None and "avx512_bf16" not in flags and "amx_bf16" not in flags:
            line += ("; this CPU has no bf16 matrix instructions (avx512_bf16/amx_bf16), "
                     "so it likely runs slower than fp32")
    return line
