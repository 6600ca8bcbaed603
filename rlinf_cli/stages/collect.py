"""`rlinf collect`: run a policy in a simulator and append its episodes to a dataset."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from rlinf_cli.api import Obs, StepBatch
from rlinf_cli.data.dataset import DatasetWriter, Episode
from rlinf_cli.errors import UserError
from rlinf_cli.runtime.rollout import EpisodeStats
from rlinf_cli.stages import common


class EpisodeBuffer:
    """Records each env's steps while its episode runs (a recorder for run_episodes)."""

    def __init__(self, n: int):
        self.steps: list[list[tuple[Obs, np.ndarray, float, bool]]] = [[] for _ in range(n)]
        self.ended: list[tuple[bool, bool] | None] = [None] * n

    def __call__(self, t: int, obs: Obs, out: Any, action: np.ndarray, sb: StepBatch, alive: np.ndarray) -> None:
        for i in np.flatnonzero(alive):
            self.steps[i].append(({k: v[i].copy() for k, v in obs.items()}, np.asarray(action[i]).copy(),
                                  float(sb.reward[i]), bool(sb.success[i])))
            if sb.terminated[i] or sb.truncated[i]:
                self.ended[i] = (bool(sb.terminated[i]), bool(sb.truncated[i]))

    def episode(self, i: int, seed: int) -> Episode:
        steps = self.steps[i]
        term, trunc = self.ended[i] or (False, True)
        return Episode(
            obs={k: np.stack([s[0][k] for s in steps]) for k in steps[0][0]},
            actions=np.stack([s[1] for s in steps]),
            rewards=np.array([s[2] for s in steps], dtype=np.float32),
            success=np.array([s[3] for s in steps], dtype=bool),
            terminated=term, truncated=trunc, seed=seed,
        )


def _with_noise(act: Any, spec: Any, noise: float, epsilon: float, rng: np.random.Generator) -> Any:
    if noise <= 0 and epsilon <= 0:
        return act
    rand = common.random_actor(spec, rng)

    def noisy(obs: Obs) -> tuple[Any, np.ndarray]:
        out, a = act(obs)
        a = np.array(a, copy=True)
        if noise > 0 and not spec.discrete:
            a = a + rng.normal(0.0, noise, size=a.shape).astype(np.float32)
            if spec.action.low is not None:
                a = np.clip(a, spec.action.low, spec.action.high)
        if epsilon > 0:
            swap = rng.random(a.shape[0]) < epsilon
            if swap.any():
                a[swap] = rand(obs)[1][swap]
        return out, a

    return noisy


def run(cfg: Any) -> dict[str, Any]:
    from rlinf_cli.stages import text_common

    if text_common.sim_modality(cfg.sim) == "text":
        from rlinf_cli.stages import text_eval

        return text_eval.run_collect(cfg)
    from omegaconf import OmegaConf

    from rlinf_cli import __version__
    from rlinf_cli.config import flatten
    from rlinf_cli.progress import Progress

    sim = common.make_simulator(cfg.sim)
    provenance = {
        "sim": OmegaConf.to_container(cfg.sim, resolve=True), "sim_choice": cfg.choices.get("sim"),
        "policy": str(cfg.policy), "seed": int(cfg.seed), "action_noise": float(cfg.action_noise),
        "epsilon": float(cfg.epsilon), "rlinf_version": __version__, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    ctx = common.start(cfg, "collect", f"{cfg.sim.name}-{str(cfg.policy).split('/')[-1]}")
    rng = np.random.default_rng(int(cfg.seed))
    act = common.make_actor(str(cfg.policy), sim, ctx.device, bool(cfg.deterministic), int(cfg.seed))
    act = _with_noise(act, sim.spec, float(cfg.action_noise), float(cfg.epsilon), rng)
    writer = DatasetWriter(cfg.output, sim.spec, provenance, int(cfg.chunk_episodes))
    env = None
    try:  # whatever fails from here on, the dataset keeps what it had and is released
        # appending continues after every seed tried before (kept or dropped by only_success)
        first_seed = writer.seed_after(int(cfg.seed) + writer.episodes_written)
        writer.provenance["first_seed"] = first_seed
        want = int(cfg.episodes)
        kept: list[Episode] = []
        tried = 0
        executor = common.make_executor(cfg.executor, common.runtime_options(cfg, act, sim.spec, int(cfg.num_envs)))
        n = max(1, min(int(cfg.num_envs), want))
        env = executor.make_vec_env(sim, n, autoreset=False)
        from rlinf_cli.runtime.rollout import run_episodes

        with ctx.track(cfg, common.plugin_tags(cfg)) as tracker, \
                Progress(ctx.log, f"collect {cfg.policy}", want, "episodes", enabled=bool(cfg.progress)) as progress:
            tracker.log_params(flatten(cfg))
            try:
                while len(kept) < want:
                    if tried >= 20 * want:
                        ctx.note(f"stopping: {tried} episodes tried, {len(kept)} kept "
                                 f"(only_success=true and the policy rarely succeeds)")
                        break
                    seeds = [first_seed + tried + i for i in range(n)]
                    buf = EpisodeBuffer(n)
                    stats = run_episodes(env, act, seeds, buf)
                    tried += n
                    writer.next_seed = first_seed + tried
                    for i, st in enumerate(stats):
                        if len(kept) >= want or (cfg.only_success and not st.success_once):
                            continue
                        ep = buf.episode(i, seeds[i])
                        kept.append(ep)
                        writer.add(ep)
                        progress.update(1, (f"success {np.mean([e.success.any() for e in kept]):.0%}  "
                                            if sim.spec.has_success else "")
                                        + f"return {np.mean([e.rewards.sum() for e in kept]):.1f}")
                writer.close()
            except KeyboardInterrupt:
                progress.close()
                writer.close()  # finished episodes are never lost
                ctx.note(f"interrupted: {writer.added} episodes were added to {writer.path} ({writer.episodes_written} "
                         f"in total); run the same command again to add more (it continues with fresh seeds)")
                raise
            progress.close()
            summary = common.summarize([EpisodeStats(float(e.rewards.sum()), len(e), bool(e.success.any()),
                                                     bool(e.success[-1])) for e in kept], sim.spec.has_success)
            tracker.log_metrics({f"collect/{k}": v for k, v in summary.items()}, 0)
            tracker.log_artifact(writer.path / "meta.json", "dataset")
            result = {"stage": "collect", "dataset": str(writer.path), "episodes_added": len(kept),
                      "episodes_total": writer.episodes_written, "tried": tried, "run_dir": str(ctx.run_dir),
                      "seconds": round(time.time() - ctx.started, 2), "summary": summary, "mlflow_run_id": tracker.run_id}
            table = common.eval_table({f"{cfg.policy}": summary}, f"rlinf collect -> {writer.path}")
            common.write_result(ctx, tracker, result, table)
            ctx.console.print(table)
            ctx.note(f"dataset: {writer.path} ({writer.episodes_written} episodes in total)")
    finally:
        writer.close()
        if env is not None:
            env.close()
    if not kept:
        raise UserError("no episode was kept; nothing was added to the dataset")
    return result
