"""Do the lesser-CPU variables of `make test-portable` (tools/portable.py) really change results on
this CPU? Each setting runs the same ops in a fresh process; the table shows which results differ
from this CPU's own (a fingerprint of the bits), so a variable that changes nothing here is known
to test nothing here.

    python benchmarks/cpu_variables.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from portable import CONFIGS, environment  # noqa: E402

PROBE = r"""
import hashlib, json, torch
def h(t): return hashlib.sha1(t.detach().contiguous().numpy().tobytes()).hexdigest()[:8]
g = torch.Generator().manual_seed(0)
a, w, b = torch.randn(256, 67, generator=g), torch.randn(64, 67, generator=g), torch.randn(64, generator=g)
x = torch.randn(100003, generator=g)
s, k = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
m1, m2 = torch.randn(256, 64, generator=g), torch.randn(64, 64, generator=g)
big1, big2 = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
out = {"linear 256x67x64 (MKL sgemm)": h(torch.nn.functional.linear(a, w, b)),
       "256x64 @ 64x64": h(m1 @ m2), "512x512 @ 512x512": h(big1 @ big2),
       "tanh (vectorised)": h(torch.tanh(x)), "sum of 100k (threads)": h(x.sum()),
       "log_softmax": h(torch.log_softmax(a, -1))}
try:
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    out["64x64 under oneDNN bf16 math"] = h(s @ k)
    torch.backends.mkldnn.matmul.fp32_precision = "none"
except Exception as exc:
    out["64x64 under oneDNN bf16 math"] = type(exc).__name__
out["threads"] = str(torch.get_num_threads())
print(json.dumps(out))
"""

SINGLE = {"MKL_ENABLE_INSTRUCTIONS=AVX2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
          "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
          "ONEDNN_MAX_CPU_ISA=AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
          "ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
          "ATEN_CPU_CAPABILITY=avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
          "OMP_NUM_THREADS=1": {"OMP_NUM_THREADS": "1"}}


def probe(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    base = environment("default")
    ref = probe(base)
    keys = [k for k in ref if k != "threads"]
    rows = [("this CPU (default)", ref)]
    for name, extra in SINGLE.items():
        rows.append((name, probe({**base, **extra})))
    for name in CONFIGS:
        rows.append((f"make test-portable: {name}", probe(environment(name))))
    print("| setting | threads | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for name, res in rows:
        cells = [res[k] if name.startswith("this CPU") else ("changed" if res[k] != ref[k] else "same") for k in keys]
        print(f"| {name} | {res['threads']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
