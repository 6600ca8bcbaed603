"""rlinf GRPO vs TRL's GRPOTrainer: same tiny model, SFT checkpoint, prompts and settings, one run.

Both start from the same SFT checkpoint (a ~5M Qwen2 with rlinf's character tokenizer, trained on
2-digit addition), see the same prompts in the same order (16 per step), sample 8 completions
per prompt with at most 4 new tokens at temperature 1, and take one AdamW step per batch (lr,
eps 1e-5, grad-norm clip 1.0, no KL, no reference model, clip 0.2/0.28, token-level loss,
group-std advantages). The two run interleaved step by step in one process: after each TRL step a
callback runs one rlinf step, so load from other processes on a shared machine hits both alike.
The rlinf step is the body of `rlinf rl`'s loop (rlinf_cli/stages/rl.py) with the text world: the same
rollout `collect`, the one `update` and the same Engine, with the same prompt seeds, minus
the per-iteration tracking. Reported per system: median seconds per step (sampling + update), median generated
tokens/s (completion tokens / step time) and generation-phase tokens/s, and held-out greedy
exact-match accuracy of the final model (the same evaluator and 300 held-out prompts for both).

    python benchmarks/grpo_vs_trl.py                  # builds the SFT checkpoint first (~5 min)
    python benchmarks/grpo_vs_trl.py --sft DIR --steps 100 --seeds 0 1 2

Needs the bench extra: pip install -e '.[bench]' (trl).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TASK = {"name": "arithmetic", "min_digits": 2, "digits": 2, "ops": "+", "max_new_tokens": 4}
SIM_OVERRIDES = ["sim=arithmetic", "sim.min_digits=2", "sim.digits=2", "sim.max_new_tokens=4"]


def build_sft(workdir: Path, epochs: int) -> Path:
    """rlinf collect (expert solutions) + rlinf sft: the shared starting checkpoint."""
    rlinf = str(Path(sys.executable).with_name("rlinf"))
    common = ["tracking.enabled=false", "progress=false"]
    subprocess.run([rlinf, "collect", *SIM_OVERRIDES, "policy=expert", "episodes=6000", f"output={workdir}/add2.jsonl",
                    *common], check=True, cwd=workdir)
    subprocess.run([rlinf, "sft", f"dataset={workdir}/add2.jsonl", "model=hf", f"algo.epochs={epochs}",
                    "algo.minibatch_size=64", "algo.lr=1e-3", "eval.episodes=0", f"run_dir={workdir}/sft", *common],
                   check=True, cwd=workdir)
    return workdir / "sft" / "checkpoints" / "best"


def _world(seed: int):
    """rlinf's text world for the benchmark's task (what `rlinf rl` builds for sim=arithmetic)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from rlinf_cli import collectors

    cfg = OmegaConf.create({"seed": seed, "num_envs": 8, "text": {"max_new_tokens": None}, "sim": dict(TASK)})
    return collectors.make(cfg, SimpleNamespace(device="cpu"), cfg.sim, text=True)


def heldout_accuracy(policy, n: int) -> float:
    return _world(0).evaluator.evaluate(policy, n, 1_000_000, examples=0).summary["accuracy"]


def step_prompts(seed: int, steps: int, groups: int) -> list[list]:
    """The prompts rlinf's `rl` stage draws at each iteration (one process), for TRL's dataset."""
    from rlinf_cli.collectors import training_seeds
    from rlinf_sim_reasoning.tasks import ArithmeticTask

    task = ArithmeticTask(TASK)
    return [task.prompts(training_seeds(seed, it * 64, groups)) for it in range(steps)]


class RlinfStepper:
    """One `rlinf rl` text iteration per call, as the rl stage runs it (torch engine, one process)."""

    def __init__(self, sft: Path, seed: int, a: argparse.Namespace):
        import torch

        from rlinf_algos.grpo import GRPO
        from rlinf_cli.policy import load_policy
        from rlinf_cli.runtime.engine import make_engine
        from rlinf_cli.stages.common import seed_everything

        seed_everything(seed)
        self.policy = load_policy(sft)
        self.algo = GRPO.from_config({"groups": a.prompts, "group_size": a.group, "epochs": 1, "lr": a.lr,
                                      "minibatch_size": a.prompts * a.group, "max_grad_norm": 1.0})
        self.engine = make_engine(self.policy, self.algo.optim, {"backend": "torch"})
        self.generator = torch.Generator().manual_seed(seed)
        self.world = _world(seed)
        self.world.rollout.start(self.policy, self.algo, 0, 1, {"iteration": 0}, None)
        self.it = 0
        self.step_s: list[float] = []
        self.gen_s: list[float] = []
        self.tokens: list[int] = []
        self.reward: list[float] = []

    def step(self) -> None:
        from rlinf_cli.runtime.update import update

        t0 = time.perf_counter()
        exp = self.world.rollout.collect(self.policy, self.algo, self.it)
        update(self.engine, self.algo, exp, self.world.batches, self.generator)
        self.step_s.append(time.perf_counter() - t0)
        stats = self.world.rollout.metrics(exp, self.step_s[-1])
        self.gen_s.append(self.world.rollout._last.seconds)
        self.tokens.append(int(stats["rollout/generated_tokens"]))
        self.reward.append(stats["rollout/reward_mean"])
        self.it += 1


def run_pair(sft: Path, seed: int, a: argparse.Namespace, out: Path) -> dict[str, dict]:
    """TRL's trainer, with one rlinf step after each TRL step; returns both systems' numbers."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlinf_cli.api import TextSample
    from rlinf_model_hf.model import HFCausalLM
    from rlinf_sim_reasoning.tasks import ArithmeticTask

    task = ArithmeticTask(TASK)
    hf_dir = sft / "hf"
    tok = AutoTokenizer.from_pretrained(hf_dir)
    assert tok("1")["input_ids"][0] == tok.bos_token_id, "the tokenizer must prepend <bos> like rlinf's prompts"
    rows = [{"prompt": s.prompt, "answer": s.answer} for step in step_prompts(seed, a.steps, a.prompts) for s in step]
    tokens: list[int] = []
    gen_s: list[float] = []

    def reward(prompts, completions, answer, completion_ids=None, **_):
        tokens.append(sum(len(c) for c in completion_ids) if completion_ids is not None else 0)
        return [float(task.score(TextSample(p, ans), c).correct) for p, c, ans in zip(prompts, completions, answer)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.t0, self.step_s = 0.0, []

        def on_step_begin(self, *args, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            self.step_s.append(time.perf_counter() - self.t0)

    class Interleave(TrainerCallback):
        def on_step_end(self, *args, **kwargs):
            rlinf.step()

    timer = StepTimer()
    rlinf = RlinfStepper(sft, seed, a)
    config = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=a.prompts * a.group, gradient_accumulation_steps=1,
        num_generations=a.group, max_completion_length=TASK["max_new_tokens"], learning_rate=a.lr,
        lr_scheduler_type="constant", warmup_steps=0, adam_epsilon=1e-5, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, epsilon=0.2, epsilon_high=0.28, num_iterations=1, loss_type="dapo", scale_rewards="group",
        temperature=1.0, top_p=1.0, max_steps=a.steps, logging_steps=10**6, save_strategy="no", report_to=[],
        use_cpu=True, bf16=False, seed=seed, shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[timer, Interleave()])
    inner = trainer._generate_and_score_completions

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            gen_s.append(time.perf_counter() - t)

    trainer._generate_and_score_completions = timed
    torch.set_num_threads(a.threads)
    trainer.train()
    shell = HFCausalLM.from_pretrained(sft)
    shell.lm = trainer.model.float().eval()
    trl_numbers = {"step_s": timer.step_s, "gen_s": gen_s, "tokens": tokens, "accuracy": heldout_accuracy(shell, a.eval)}
    rlinf_numbers = {"step_s": rlinf.step_s, "gen_s": rlinf.gen_s, "tokens": rlinf.tokens, "reward": rlinf.reward,
                     "accuracy": heldout_accuracy(rlinf.policy, a.eval)}
    return {"rlinf": rlinf_numbers, "trl": trl_numbers}


def med(xs: list[float], skip: int = 2) -> float:
    xs = xs[skip:] if len(xs) > skip + 2 else xs
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sft", type=Path, help="SFT checkpoint (rlinf sft output); built when omitted")
    p.add_argument("--sft-epochs", type=int, default=8, help="epochs when building the SFT checkpoint")
    p.add_argument("--steps", type=int, default=50, help="GRPO steps per run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--prompts", type=int, default=16, help="prompts per step")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--eval", type=int, default=300, help="held-out prompts for accuracy")
    p.add_argument("--threads", type=int, default=1, help="torch threads (both systems)")
    p.add_argument("--out", type=Path, default=None, help="write the raw numbers here (JSON)")
    a = p.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(a.threads)
    work = Path(tempfile.mkdtemp(prefix="rlinf-bench-"))
    sft = a.sft or build_sft(work, a.sft_epochs)
    from rlinf_cli.policy import load_policy

    before = heldout_accuracy(load_policy(sft), a.eval)
    runs: dict[str, list[dict]] = {"rlinf": [], "trl": []}
    for seed in a.seeds:
        pair = run_pair(sft, seed, a, work / f"trl-{seed}")
        for name in ("rlinf", "trl"):
            r = pair[name]
            runs[name].append(r)
            print(f"seed {seed} {name:5s}: {med(r['step_s']):.3f} s/step, accuracy {before:.1%} -> {r['accuracy']:.1%}",
                  flush=True)

    def summary(rs: list[dict]) -> dict:
        step = statistics.median(med(r["step_s"]) for r in rs)
        toks = statistics.median(med([t / s for t, s in zip(r["tokens"], r["step_s"])]) for r in rs)
        gen = statistics.median(med([t / g for t, g in zip(r["tokens"], r["gen_s"])]) for r in rs)
        gen_share = statistics.median(med([g / s for g, s in zip(r["gen_s"], r["step_s"])]) for r in rs)
        acc = statistics.mean(r["accuracy"] for r in rs)
        return {"step_s": step, "tokens_per_s": toks, "gen_tokens_per_s": gen, "gen_share": gen_share, "accuracy": acc}

    s = {k: summary(v) for k, v in runs.items()}
    print(f"\nGRPO, {a.prompts} prompts x {a.group} samples, <= {TASK['max_new_tokens']} new tokens, {a.steps} steps, "
          f"seeds {a.seeds}, {a.threads} thread(s); accuracy = held-out greedy exact match on {a.eval} prompts")
    print(f"{'':8s}{'s/step':>9s}{'tok/s':>9s}{'gen tok/s':>11s}{'gen share':>11s}{'acc before':>12s}{'acc after':>11s}")
    for k in ("rlinf", "trl"):
        v = s[k]
        print(f"{k:8s}{v['step_s']:9.3f}{v['tokens_per_s']:9.0f}{v['gen_tokens_per_s']:11.0f}{v['gen_share']:11.0%}"
              f"{before:12.1%}{v['accuracy']:11.1%}")
    r, t = s["rlinf"], s["trl"]
    print(f"ratio rlinf/TRL: {t['step_s'] / r['step_s']:.2f}x faster per step, {r['tokens_per_s'] / t['tokens_per_s']:.2f}x "
          f"tokens/s, {r['gen_tokens_per_s'] / t['gen_tokens_per_s']:.2f}x generation tokens/s; "
          f"accuracy {r['accuracy']:.1%} vs {t['accuracy']:.1%}")
    if a.out:
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "before": before,
                                     "summary": s, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
