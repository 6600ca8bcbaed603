"""`rlinf sft`: behaviour cloning of a model on a dataset written by `rlinf collect`."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from rlinf_cli.errors import UserError
from rlinf_cli.stages import common


def split_episodes(episode_ids: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row masks (train, val), holding out whole episodes so validation sees unseen trajectories."""
    unique = np.unique(episode_ids)
    rng = np.random.default_rng(seed)
    n_val = int(math.ceil(val_fraction * len(unique))) if len(unique) >= 2 and val_fraction > 0 else 0
    val_eps = rng.permutation(unique)[:n_val]
    val = np.isin(episode_ids, val_eps)
    return ~val, val


def run(cfg: Any) -> dict[str, Any]:
    from rlinf_cli.stages import text_common

    if text_common.is_text_dataset(cfg.dataset):  # a JSONL of prompt/completion pairs: language models
        from rlinf_cli.stages import text_sft

        return text_sft.run(cfg)
    import torch

    from rlinf_cli import checkpoint as ckpt
    from rlinf_cli.config import flatten, to_yaml
    from rlinf_cli.data import dataset as ds
    from rlinf_cli.policy import check_compatible, load_policy, obs_to_torch
    from rlinf_cli.registry import get_registry
    from rlinf_cli.runtime.trainer import make_optimizer, set_lr
    from omegaconf import OmegaConf

    data = ds.load(cfg.dataset)
    algo = get_registry().load("algorithm", cfg.algo.name).from_config(cfg.algo)
    if algo.rollout != "supervised":
        raise UserError(f"algorithm '{cfg.algo.name}' is an RL algorithm: `rlinf sft` needs a supervised one (algo=bc)")
    if getattr(algo.config, "loss", "") == "mse" and data.spec.discrete:
        raise UserError("algo.loss=mse needs continuous actions; this dataset has discrete actions: use algo.loss=nll")
    provenance = data.meta["provenance"][-1] if data.meta.get("provenance") else {}
    sim_node = provenance.get("sim")
    # the checkpoint remembers the dataset's simulator, so `rl init=` and `eval` can use it
    OmegaConf.set_struct(cfg, False)
    if sim_node:
        cfg.sim = sim_node
        cfg.choices.sim = provenance.get("sim_choice", sim_node.get("name"))
    ctx = common.start(cfg, "sft", f"{(sim_node or {}).get('name', 'dataset')}-{cfg.model.name}")
    if cfg.init:
        policy = load_policy(cfg.init, ctx.device)
        check_compatible(policy, data.spec, f"checkpoint '{cfg.init}'")
    else:
        policy = get_registry().load("model", cfg.model.name)(cfg.model, data.spec).to(ctx.device)
    c = algo.config
    train_rows, val_rows = split_episodes(data.episode, float(cfg.val_fraction), int(cfg.seed))
    obs = obs_to_torch(data.obs, ctx.device)
    actions = torch.as_tensor(data.actions, device=ctx.device)
    train_idx = torch.from_numpy(np.flatnonzero(train_rows))
    val_idx = torch.from_numpy(np.flatnonzero(val_rows))
    optimizer = make_optimizer(policy, c)
    generator = torch.Generator().manual_seed(int(cfg.seed))
    cfg_yaml = to_yaml(cfg)
    best = (math.inf, -1)
    bad_epochs = 0
    mb = min(c.minibatch_size, len(train_idx))

    def batch_loss(idx: torch.Tensor) -> torch.Tensor:
        return algo.supervised_loss(policy, {k: v[idx] for k, v in obs.items()}, actions[idx])

    from rlinf_cli.progress import Progress

    with ctx.track(cfg, common.plugin_tags(cfg)) as tracker, \
            Progress(ctx.log, f"sft {cfg.model.name}", c.epochs, "epochs", enabled=bool(cfg.progress)) as progress:
        ckpt_dir = ctx.run_dir / "checkpoints"
        tracker.log_params(flatten(cfg))
        tracker.log_artifact(data.path / ds.META, "dataset")
        for epoch in range(c.epochs):
            if c.anneal_lr:
                set_lr(optimizer, c.lr * (1 - epoch / c.epochs))
            policy.train()
            perm = train_idx[torch.randperm(len(train_idx), generator=generator)]
            total, count = 0.0, 0
            for start in range(0, len(perm), mb):
                loss = batch_loss(perm[start:start + mb])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if c.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(policy.parameters(), c.max_grad_norm)
                optimizer.step()
                total += float(loss.detach())
                count += 1
            policy.eval()
            metrics = {"train/loss": total / max(count, 1), "epoch": float(epoch + 1)}
            with torch.no_grad():
                if len(val_idx):
                    metrics["val/loss"] = float(batch_loss(val_idx))
            score = metrics.get("val/loss", metrics["train/loss"])
            if score < best[0]:
                best, bad_epochs = (score, epoch + 1), 0
                ckpt.save(ckpt_dir / "best", policy, cfg_yaml)
            else:
                bad_epochs += 1
            tracker.log_metrics(metrics, epoch + 1)
            progress.update(1, f"loss {metrics['train/loss']:.4f}" + (f"  val {metrics['val/loss']:.4f}" if "val/loss" in metrics else ""))
            if c.patience is not None and bad_epochs >= c.patience:
                ctx.note(f"early stop: no better validation loss for {c.patience} epochs")
                break
        progress.close()
        ckpt.save(ckpt_dir / "last", policy, cfg_yaml)
        best_dir = ckpt_dir / "best"
        summary: dict[str, float] = {}
        if int(cfg.eval.episodes) > 0 and sim_node:
            from rlinf_cli.runtime.rollout import policy_actor

            best_policy = load_policy(best_dir, ctx.device)
            sim = common.make_simulator(sim_node)
            act = policy_actor(best_policy, sim.spec, ctx.device, bool(cfg.eval.deterministic))
            executor = common.make_executor(cfg.executor, common.runtime_options(cfg, act, sim.spec, 8))
            summary = common.summarize(common.evaluate(act, sim, executor, int(cfg.eval.episodes), int(cfg.eval.seed), 8),
                                       sim.spec.has_success)
            tracker.log_metrics({f"eval/{k}": v for k, v in summary.items()}, best[1])
        result = {"stage": "sft", "run_dir": str(ctx.run_dir), "checkpoint": str(best_dir), "best_epoch": best[1],
                  "best_loss": best[0], "train_samples": int(len(train_idx)), "val_samples": int(len(val_idx)),
                  "seconds": round(time.time() - ctx.started, 2), "eval": summary, "mlflow_run_id": tracker.run_id}
        table = common.eval_table({f"sft {cfg.model.name} (best epoch {best[1]})": summary}, "rlinf sft") if summary else None
        common.write_result(ctx, tracker, result, table, ("epoch", ["train/loss", "val/loss"], "rlinf sft"))
        if table is not None:
            ctx.console.print(table)
        ctx.note(f"run: {ctx.run_dir}  best checkpoint: {best_dir} (epoch {best[1]}, loss {best[0]:.4f})")
    return result
