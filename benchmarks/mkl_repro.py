"""What MKL's reproducibility mode costs: the same CPU workloads with MKL_CBWR off, AUTO,STRICT
(rlinf's default, see rlinf_cli/determinism.py) and COMPATIBLE, interleaved in one run.

Each workload runs in a fresh subprocess per mode (MKL fixes the mode at its first call); the
table gives the median time per operation over the repeats and the ratio to "off".

    python benchmarks/mkl_repro.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine_line, median, table  # noqa: E402

MODES = {"off": None, "AUTO,STRICT": "AUTO,STRICT", "COMPATIBLE": "COMPATIBLE"}

# Runs in the child: plain torch (and transformers), never rlinf, so the env var alone decides.
CHILD = r'''
import json, sys, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
name = sys.argv[1]

def timed(fn, n):
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n

if name == "ppo_update":  # rlinf's default MLP actor-critic: one 256-sample gradient step
    net = torch.nn.Sequential(torch.nn.Linear(17, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, 7))
    opt = torch.optim.Adam(net.parameters(), lr=3e-4)
    x, y = torch.randn(256, 17), torch.randn(256, 7)
    def step():
        opt.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
    sec = timed(step, 2000)
elif name == "matmul_512":
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    sec = timed(lambda: a @ b, 200)
elif name == "tiny_lm_step":  # the text path: a ~5M-parameter Qwen2, forward+backward on 8x64 tokens
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=64, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = Qwen2ForCausalLM(cfg)
    ids = torch.randint(0, 64, (8, 64))
    def step():
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
    sec = timed(step, 20)
print(json.dumps({"sec": sec}))
'''

WORKLOADS = ["ppo_update", "matmul_512", "tiny_lm_step"]


def run_child(workload: str, mode: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if mode is not None:
        env["MKL_CBWR"] = mode
    out = subprocess.run([sys.executable, "-c", CHILD, workload], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["sec"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(machine_line())
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):  # interleaved: load drifts hit every mode alike
        for w in WORKLOADS:
            for label, mode in MODES.items():
                times.setdefault((w, label), []).append(run_child(w, mode))
    rows = []
    for w in WORKLOADS:
        base = median(times[(w, "off")])
        for label in MODES:
            m = median(times[(w, label)])
            rows.append([w, label, f"{m * 1e6:,.0f}", f"{m / base:.2f}x"])
    print(table(["workload", "MKL_CBWR", "median us/op", "vs off"], rows))


if __name__ == "__main__":
    main()
