"""`rlinf sft` on a JSONL file of prompt/completion pairs: supervised fine-tuning of a language model.

Prompts are encoded as the policy encodes them for RL (chat template when the tokenizer has
one), the completion is followed by eos, and the loss is the mean NLL of completion tokens only.
The best checkpoint is picked on a held-out fraction of the rows. When the JSONL was written by
`rlinf collect` on a text task, its provenance names the task: the checkpoint remembers it (so
`rl init=` and `eval` reuse it) and the task's held-out prompts are scored after training.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from rlinf_cli.errors import UserError
from rlinf_cli.stages import common, text_common as tc


def encode(policy: Any, pairs: list[tuple[str, str]], max_length: int) -> tuple[list[list[int]], list[list[int]], int]:
    """(token rows, loss masks, dropped count): prompt tokens masked 0, completion + eos masked 1."""
    prompts = policy.encode_prompts([p for p, _ in pairs])
    rows, masks, dropped = [], [], 0
    for prompt, (_, completion) in zip(prompts, pairs):
        target = policy.encode_text(completion) + [policy.eos_token_id]
        if len(prompt) + len(target) > max_length:
            dropped += 1
            continue
        rows.append(list(prompt) + target)
        masks.append([0] * len(prompt) + [1] * len(target))
    return rows, masks, dropped


def pack(rows: list[list[int]], masks: list[list[int]], max_length: int) -> tuple[list[list[int]], list[list[int]]]:
    """Greedy packing: consecutive examples share a row up to ``max_length`` tokens."""
    out_rows, out_masks, cur, cur_m = [], [], [], []
    for r, m in zip(rows, masks):
        if cur and len(cur) + len(r) > max_length:
            out_rows.append(cur)
            out_masks.append(cur_m)
            cur, cur_m = [], []
        cur, cur_m = cur + r, cur_m + m
    if cur:
        out_rows.append(cur)
        out_masks.append(cur_m)
    return out_rows, out_masks


def collate(rows: list[list[int]], masks: list[list[int]], pad: int, device: Any) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    loss = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, :len(r)] = torch.tensor(r)
        attn[i, :len(r)] = 1
        loss[i, :len(m)] = torch.tensor(m)
    return ids.to(device), attn.to(device), loss.to(device)


def run(cfg: Any) -> dict[str, Any]:
    import torch
    from omegaconf import OmegaConf

    from rlinf_cli import checkpoint as ckpt
    from rlinf_cli.config import flatten, to_yaml
    from rlinf_cli.progress import Progress
    from rlinf_cli.registry import get_registry
    from rlinf_cli.runtime import distributed

    algo = get_registry().load("algorithm", cfg.algo.name).from_config(cfg.algo)
    if algo.rollout != "supervised":
        raise UserError(f"algorithm '{cfg.algo.name}' is an RL algorithm: `rlinf sft` needs a supervised one (algo=bc)")
    t = cfg.text
    pairs = tc.read_pairs(str(cfg.dataset), str(t.prompt_key), str(t.completion_key))
    provenance = (tc.read_meta(str(cfg.dataset)).get("provenance") or [{}])[-1]
    sim_node = provenance.get("sim")
    OmegaConf.set_struct(cfg, False)
    if sim_node:  # the checkpoint remembers the task, so `rl init=` and `eval` reuse it
        cfg.sim = sim_node
        cfg.choices.sim = provenance.get("sim_choice", sim_node.get("name"))
    ctx = common.start(cfg, "sft", f"{(sim_node or {}).get('name', 'jsonl')}-{cfg.model.name}")
    policy = tc.build_policy(cfg, cfg.init, ctx.device)
    c = algo.config
    rows, masks, dropped = encode(policy, pairs, int(t.max_length))
    if not rows:
        raise UserError(f"every example is longer than text.max_length={t.max_length} tokens; raise it")
    if dropped:
        ctx.note(f"dropped {dropped} examples longer than text.max_length={t.max_length} tokens")
    rng = np.random.default_rng(int(cfg.seed))
    order = rng.permutation(len(rows))
    n_val = int(math.ceil(float(cfg.val_fraction) * len(rows))) if len(rows) >= 2 and cfg.val_fraction > 0 else 0
    val_idx, train_idx = order[:n_val], order[n_val:]
    train_rows, train_masks = [rows[i] for i in train_idx], [masks[i] for i in train_idx]
    if t.packing:
        train_rows, train_masks = pack(train_rows, train_masks, int(t.max_length))
    engine = distributed.make_engine(policy, c, cfg.train, ctx.accelerator)
    pad = policy.pad_token_id
    mb = max(1, min(int(c.minibatch_size), len(train_rows)))
    steps_per_epoch = math.ceil(len(train_rows) / mb)
    total_steps = steps_per_epoch * int(c.epochs)
    cfg_yaml = to_yaml(cfg)
    best, bad_epochs, step = (math.inf, -1), 0, 0

    def val_loss() -> float:
        policy.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for s in range(0, len(val_idx), 256):
                idx = val_idx[s:s + 256]
                ids, attn, lm = collate([rows[i] for i in idx], [masks[i] for i in idx], pad, ctx.device)
                total += float(policy.sequence_nll(ids, attn, lm)) * len(idx)
                count += len(idx)
        return total / max(count, 1)

    with ctx.track(cfg, {**common.plugin_tags(cfg), "rlinf.modality": "text"}) as tracker, \
            Progress(ctx.log, f"sft {cfg.model.name}", total_steps, "steps", enabled=bool(cfg.progress)) as progress:
        ckpt_dir = ctx.run_dir / "checkpoints"
        tracker.log_params(flatten(cfg))
        t0 = time.perf_counter()
        tokens = 0
        for epoch in range(int(c.epochs)):
            policy.train()
            perm = rng.permutation(len(train_rows))
            total, count = 0.0, 0
            for s in range(0, len(perm), mb):
                if c.anneal_lr:
                    engine.set_lr(c.lr * (1 - step / total_steps))
                idx = perm[s:s + mb]
                ids, attn, lm = collate([train_rows[i] for i in idx], [train_masks[i] for i in idx], pad, ctx.device)
                loss = policy.sequence_nll(ids, attn, lm)
                engine.backward(loss)
                engine.step()
                total += float(loss.detach())
                count += 1
                step += 1
                tokens += int(attn.sum())
                progress.update(1, f"loss {total / count:.4f}")
            metrics = {"train/loss": total / max(count, 1), "epoch": float(epoch + 1),
                       "time/tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9)}
            if n_val:
                metrics["val/loss"] = val_loss()
            score = metrics.get("val/loss", metrics["train/loss"])
            if score < best[0]:
                best, bad_epochs = (score, epoch + 1), 0
                with engine.full_parameters():
                    ckpt.save(ckpt_dir / "best", policy, cfg_yaml)
            else:
                bad_epochs += 1
            tracker.log_metrics(metrics, epoch + 1)
            if c.patience is not None and bad_epochs >= c.patience:
                ctx.note(f"early stop: no better validation loss for {c.patience} epochs")
                break
        progress.close()
        with engine.full_parameters():
            ckpt.save(ckpt_dir / "last", policy, cfg_yaml)
        best_dir = ckpt_dir / "best"
        summary: dict[str, float] = {}
        examples: list[Any] = []
        if int(cfg.eval.episodes) > 0 and sim_node:
            from rlinf_cli.policy import load_policy

            task = tc.make_task(sim_node)
            best_policy = load_policy(best_dir, ctx.device)
            summary, examples = tc.evaluate(best_policy, task, int(cfg.eval.episodes), int(cfg.eval.seed),
                                            tc.max_new_tokens(t, task))
            tracker.log_metrics({f"eval/{k}": v for k, v in summary.items()}, best[1])
        result = {"stage": "sft", "modality": "text", "run_dir": str(ctx.run_dir), "checkpoint": str(best_dir),
                  "best_epoch": best[1], "best_loss": best[0], "train_examples": int(len(train_idx)),
                  "val_examples": int(n_val), "dropped": dropped, "seconds": round(time.time() - ctx.started, 2),
                  "eval": summary, "examples": tc.examples_json(examples, 8), "mlflow_run_id": tracker.run_id}
        table = tc.summary_table({f"sft {cfg.model.name} (best epoch {best[1]})": summary}, "rlinf sft") if summary else None
        common.write_result(ctx, tracker, result, table, ("epoch", ["train/loss", "val/loss"], "rlinf sft"))
        if table is not None:
            ctx.console.print(table)
            ctx.console.print(tc.examples_table(examples, 8))
        ctx.note(f"run: {ctx.run_dir}  best checkpoint: {best_dir} (epoch {best[1]}, loss {best[0]:.4f})")
    return result
