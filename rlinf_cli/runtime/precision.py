"""Training precision: ``train.bf16`` read, oneDNN's bf16 math probed, the matmul flags switched.

``train.bf16=true`` trains in mixed precision in one of two forms (the engine picks,
:class:`~rlinf_cli.runtime.engine.TorchEngine`): ``torch.autocast(bfloat16)``, where matrix
products run in bf16 while weights, gradients and optimizer state stay fp32; or, on a CPU whose
oneDNN has bf16 kernels and for a policy without convolutions, every tensor fp32 and oneDNN
computing the fp32 matrix products from bf16-rounded inputs with fp32 accumulation (torch's
``mkldnn.matmul.fp32_precision = "bf16"``, set for the forward and backward passes only): the same
bf16 products without autocast's per-step casts of weights and activations or bf16 elementwise
ops: 7.6 vs 8.6 ms per SAC step (256x256, batch 256; benchmarks/sac_step.py). Convolutions stay
with autocast, whose bf16 kernels beat oneDNN's fp32 mode there (30 vs 38 ms for a two-layer
encoder's forward and backward at batch 256, measured). Models read :func:`fp32_matmuls` and
:func:`onednn_bf16_active` (through ``rlinf_cli.api``) to keep their first and output layers in
full fp32.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Sequence

import torch

from rlinf_cli.errors import UserError

BF16_VALUES = ("auto", "true", "false")


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


def hidden_shapes(module: torch.nn.Module) -> list[tuple[int, int]]:
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


def bf16_setting(value: Any) -> bool | str:
    """``train.bf16`` as ``True``, ``False`` or ``"auto"`` (null counts as auto); anything else
    is refused rather than read as truthy (``bf16=yes`` must not silently mean something)."""
    if value is None or value is True or value is False:
        return "auto" if value is None else value
    text = str(value).strip().lower()
    if text not in BF16_VALUES:
        raise UserError(f"train.bf16 must be one of {', '.join(BF16_VALUES)}, got '{value}'")
    return "auto" if text == "auto" else text == "true"


def precision_note(engine: Any) -> str | None:
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
