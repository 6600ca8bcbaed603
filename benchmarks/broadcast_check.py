"""Weight broadcast on real devices: the trainer's side of ``placement.generation.sync=broadcast``
(rlinf_cli/runtime/weight_broadcast.py) sending a model's trainable tensors to W receivers, each in
its own process, and checking every receiver got them bit for bit; prints the median time a version
takes. On CUDA with >= 2 GPUs the group is NCCL (rank r on GPU r); otherwise gloo on the CPU.

    python benchmarks/broadcast_check.py                          # gloo, 2 receivers, 135M parameters
    python benchmarks/broadcast_check.py --backend nccl           # needs W + 1 GPUs (benchmarks/gpu_check.sh, case 9)

Exit code 0 when every receiver matched every version, 1 otherwise (one line says which).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time

# a SmolLM2-135M-shaped layout (576 wide, 30 layers, 49,152-token vocabulary): (name, shape) per tensor
WIDTH, LAYERS, FFN, VOCAB, KV = 576, 30, 1536, 49152, 192


def layout(dtype: str) -> list[tuple[str, str, tuple[int, ...]]]:
    out = [("embed.weight", dtype, (VOCAB, WIDTH))]
    for i in range(LAYERS):
        for name, shape in (("q", (WIDTH, WIDTH)), ("k", (KV, WIDTH)), ("v", (KV, WIDTH)), ("o", (WIDTH, WIDTH)),
                            ("gate", (FFN, WIDTH)), ("up", (FFN, WIDTH)), ("down", (WIDTH, FFN)),
                            ("norm1", (WIDTH,)), ("norm2", (WIDTH,))):
            out.append((f"layers.{i}.{name}.weight", dtype, shape))
    return out


def version(lay, device: str, v: int):
    import torch

    g = torch.Generator(device=device).manual_seed(v)
    return {n: torch.randn(s, generator=g, device=device).to(getattr(torch, d)) for n, d, s in lay}


def receive(address, rank: int, device: str, versions: int, out) -> None:
    import torch

    from rlinf_cli.runtime.weight_broadcast import Receiver

    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    receiver = Receiver(address, rank, device)
    for v in range(versions):
        got = receiver.receive()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        done = time.perf_counter()  # one monotonic clock for every process of this machine
        want = version(address.layout, device, v)
        bad = [n for n, t in want.items() if not torch.equal(got[n], t)]
        out.put((rank, v, done, bad[:3]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--receivers", type=int, default=2)
    p.add_argument("--versions", type=int, default=5)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = p.parse_args()
    import torch

    from rlinf_cli.runtime.weight_broadcast import GroupAddress, Sender, free_port

    if a.backend == "nccl" and torch.cuda.device_count() < a.receivers + 1:
        print(f"SKIP: nccl needs {a.receivers + 1} GPUs (one rank each), {torch.cuda.device_count()} here")
        return 0
    devices = [f"cuda:{r}" if a.backend == "nccl" else "cpu" for r in range(a.receivers + 1)]
    lay = layout(a.dtype)
    numel = sum(torch.Size(s).numel() for _, _, s in lay)
    address = GroupAddress("127.0.0.1", free_port("127.0.0.1"), a.receivers + 1, a.backend, 300.0, lay)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=receive, args=(address, r, devices[r], a.versions, out)) for r in range(1, a.receivers + 1)]
    for proc in procs:
        proc.start()
    if devices[0].startswith("cuda"):
        torch.cuda.set_device(devices[0])
    sender = Sender(address, devices[0])
    sender.open()
    times, bad = [], []
    for v in range(a.versions):
        tensors = version(lay, devices[0], v)
        t0 = time.perf_counter()
        sender.send(tensors)
        if devices[0].startswith("cuda"):
            torch.cuda.synchronize()
        replies = [out.get(timeout=300) for _ in procs]
        times.append(max(done for _, _, done, _ in replies) - t0)  # until the last receiver holds it
        bad += [f"receiver {r} version {v}: {names}" for r, v, _, names in replies if names]
    for proc in procs:
        proc.join(timeout=60)
    size = numel * torch.empty((), dtype=getattr(torch, a.dtype)).element_size()
    steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
    print(f"{a.backend} broadcast of {numel / 1e6:.1f}M {a.dtype} parameters ({size / 1e6:.0f} MB) to {a.receivers} "
          f"receivers on {', '.join(devices[1:])}: first {times[0] * 1e3:.0f} ms, median after {steady * 1e3:.0f} ms "
          f"(until the last receiver holds it), {'every version bit-equal' if not bad else 'MISMATCH: ' + bad[0]}")
    return 1 if bad or any(proc.exitcode for proc in procs) else 0


if __name__ == "__main__":
    sys.exit(main())
