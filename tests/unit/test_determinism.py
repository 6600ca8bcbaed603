"""MKL's reproducibility mode: matmuls that do not depend on memory alignment (exact resume)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.numerics  # results depend on CPU features: make test-portable runs them again

ALIGNMENT_PROBE = r'''
import rlinf_cli  # first: it must set MKL's mode before torch runs an MKL op
import torch
from rlinf_cli.determinism import mkl_cbwr_state
torch.set_num_threads(1)
torch.manual_seed(0)

def at(t, off):  # the same values at another address (offset in floats)
    buf = torch.empty(t.numel() + 64)
    view = buf[off:off + t.numel()].view(t.shape)
    view.copy_(t)
    return view

diffs = 0
for m, k, n in [(16, 4, 64), (16, 64, 64), (256, 64, 64), (64, 39, 256), (256, 256, 256), (128, 17, 64)]:
    a, b, g = torch.randn(m, k), torch.randn(k, n), torch.randn(m, n)
    ref, ref_t = a @ b, a.t() @ g
    for off in range(1, 16):
        diffs += not torch.equal(at(a, off) @ at(b, (7 * off) % 16), ref)
        diffs += not torch.equal(at(a, off).t() @ at(g, off), ref_t)
print(mkl_cbwr_state(), diffs)
'''


def _run(code: str, mkl_cbwr: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if mkl_cbwr is not None:
        env["MKL_CBWR"] = mkl_cbwr
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("user_value", [None, "COMPATIBLE"])
def test_matmuls_do_not_depend_on_alignment(user_value):
    """Without MKL_CBWR in the environment rlinf turns the strict mode on; a user's value is kept.
    Either way the same operands at different addresses give bit-identical products."""
    state, diffs = _run(ALIGNMENT_PROBE, user_value).split()
    if user_value is None:
        assert state in ("strict", "n/a")  # n/a: a torch build without MKL (nothing to configure)
    else:
        assert state in ("on", "n/a")
    assert diffs == "0"


def test_the_mode_reaches_child_processes():
    code = "import rlinf_cli, os; print(os.environ['MKL_CBWR'])"
    assert _run(code, None) == "AUTO,STRICT"
    assert _run(code, "COMPATIBLE") == "COMPATIBLE"
