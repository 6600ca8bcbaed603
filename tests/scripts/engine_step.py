"""Run under torchrun: a few training steps of a tiny LM through rlinf's Engine; checks ranks agree.

Usage: torchrun --standalone --nproc_per_node 2 tests/scripts/engine_step.py deepspeed 2
Each rank trains on its own batch; after the steps every rank must hold the same weights
(gradients were averaged) and they must differ from the initial ones. Prints one JSON line.
"""

from __future__ import annotations

import json
import sys

import torch

from rlinf_cli.algorithm import OptimSpec
from rlinf_cli.runtime import engine as engines
from rlinf_cli.runtime import dist
from rlinf_model_hf.model import HFCausalLM


class _CPU:  # the accelerator surface make_engine uses
    def dist_backend(self) -> str:
        return "gloo"

    def supports_bf16(self) -> bool:
        return True

    def device(self) -> torch.device:
        return torch.device("cpu")


def main() -> None:
    backend, stage = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    torch.manual_seed(0)  # same initial weights on every rank
    torch.distributed.init_process_group("gloo")
    rank, world = dist.world()
    policy = HFCausalLM({"name": "hf", "hidden_size": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate_size": 64})
    initial = torch.cat([p.detach().reshape(-1).clone() for p in policy.parameters()])
    engine = engines.make_engine(policy, OptimSpec(lr=1e-2, max_grad_norm=0.5),
                                 {"backend": backend, "zero_stage": stage, "bf16": False}, _CPU())
    texts = [f"{rank + 1}+{i}={rank + 1 + i}" for i in range(4)]  # different data per rank
    losses = []
    for _ in range(3):
        rows = [policy.encode_prompts([t])[0] for t in texts]
        ids = torch.tensor(rows)
        attn = torch.ones_like(ids)
        out = policy.evaluate({"input_ids": ids, "attention_mask": attn}, None)
        loss = -out.logprob.mean()
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    with engine.full_parameters():
        final = torch.cat([p.detach().reshape(-1).float().clone() for p in policy.parameters()])
    gathered = [torch.zeros_like(final) for _ in range(world)]
    torch.distributed.all_gather(gathered, final)
    same = all(torch.allclose(gathered[0], g, atol=1e-6) for g in gathered)
    moved = float((final - initial.float()).abs().max()) if final.numel() == initial.numel() else -1.0
    if rank == 0:
        print(json.dumps({"backend": engine.backend, "world": world, "ranks_agree": same, "moved": moved,
                          "losses": losses}))
    dist.shutdown()


if __name__ == "__main__":
    main()
