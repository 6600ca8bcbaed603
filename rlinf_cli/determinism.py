"""Bit-exact CPU numerics across processes (resume equals an uninterrupted run).

torch's CPU matrix multiplies go through Intel MKL, whose kernels pick their summation order by
the memory alignment of the operands unless MKL's *conditional numerical reproducibility* (CNR)
mode is on. A resumed process allocates differently, so without CNR its matmuls round
differently (seen as ~1e-9 weight differences after a resume on AMD EPYC machines).

``MKL_CBWR=AUTO,STRICT`` makes results independent of alignment on the fastest code path the CPU
has (``benchmarks/mkl_repro.py`` measures its cost: none within noise on this kind of machine,
while ``COMPATIBLE`` costs ~2.4x on a 512x512 matmul). MKL reads the variable at its first call, so
:mod:`rlinf_cli` sets it on import, before any torch op, and child processes inherit it. A value
the user sets is respected.
"""

from __future__ import annotations

import os

MKL_MODE = "AUTO,STRICT"

# mkl_cbwr_get() constants (mkl_service.h)
_CBWR_BRANCH, _CBWR_ALL = 1, -1
_CBWR_OFF, _CBWR_STRICT = 1, 0x10000


def configure_env() -> None:
    """Ask MKL for reproducible results in this process and its children, unless the user chose."""
    os.environ.setdefault("MKL_CBWR", MKL_MODE)


def mkl_cbwr_state() -> str:
    """What MKL's reproducibility mode is in this process: ``strict``, ``on``, ``off`` or ``n/a``.

    ``off`` means torch ran an MKL op before rlinf could set the mode (rlinf imported after torch
    was used): results may then depend on memory alignment.
    """
    import ctypes

    import torch

    lib_path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        lib = ctypes.CDLL(lib_path)
        get = lib.mkl_serv_cbwr_get
    except (OSError, AttributeError):  # not an MKL build (aarch64, macOS): nothing to configure
        return "n/a"
    get.restype = ctypes.c_int
    settings = int(get(_CBWR_ALL)) & 0xFFFFFFFF
    if int(get(_CBWR_BRANCH)) == _CBWR_OFF:
        return "off"
    return "strict" if settings & _CBWR_STRICT else "on"
