"""Task recommendations (rlinf_cli/recommend.py): a simulator plugin's settings for a task and
algorithm fill what the user leaves unset; any override wins; `rlinf config show` marks where
each value came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlinf_cli.config import compose
from rlinf_cli.errors import UserError


def test_bare_rl_takes_the_cartpole_recommendation():
    cfg = compose("rl")
    assert cfg.sim.env_id == "CartPole-v1" and cfg.algo.name == "ppo"
    assert (cfg.algo.rollout_steps, cfg.algo.epochs, cfg.algo.lr, cfg.algo.gamma) == (32, 20, 1e-3, 0.98)
    assert cfg.recommended["for"] == "gymnasium CartPole-v1, ppo"
    assert "algo.lr" in cfg.recommended["keys"]


def test_an_override_always_wins_and_is_not_listed_as_recommended():
    cfg = compose("rl", ["algo.lr=5e-4", "algo.rollout_steps=64"])
    assert cfg.algo.lr == 5e-4 and cfg.algo.rollout_steps == 64
    assert "algo.lr" not in cfg.recommended["keys"] and "algo.rollout_steps" not in cfg.recommended["keys"]
    assert cfg.algo.epochs == 20  # the rest of the recommendation still applies


@pytest.mark.parametrize("overrides", [["sim.env_id=Acrobot-v1"], ["algo=grpo"], ["init=nowhere"],
                                       ["resume=nowhere"]])
def test_no_recommendation_for_other_tasks_algorithms_or_checkpoint_starts(overrides):
    """Recommendations are for runs from scratch on the task they name: another task, an algorithm
    the plugin recommends nothing for, fine-tuning (init=) and resume keep the plain defaults."""
    cfg = compose("rl", overrides)
    assert "recommended" not in cfg
    plain = compose("rl", overrides, recommend=False)
    assert cfg.algo == plain.algo and cfg.num_envs == plain.num_envs and cfg.total_steps == plain.total_steps


def test_sac_on_pendulum_and_ppo_on_hopper_are_recommended():
    sac = compose("rl", ["algo=sac", "sim.env_id=Pendulum-v1"])
    assert (sac.num_envs, sac.total_steps, list(sac.model.hidden_sizes), sac.model.activation) == (1, 20000, [64, 64], "relu")
    hopper = compose("rl", ["sim.env_id=Hopper-v5"])
    assert hopper.total_steps == 300000 and hopper.algo.dual_clip is None and hopper.algo.anneal_lr is False


def test_release_snapshots_compose_without_recommendations():
    assert "recommended" not in compose("rl", recommend=False)
    assert compose("rl", recommend=False).algo.rollout_steps == 128  # algo/ppo.yaml's own default


def _with_recommendation(monkeypatch, tmp_path: Path, text: str) -> None:
    from rlinf_cli import config

    (tmp_path / "recommended").mkdir()
    (tmp_path / "recommended" / "gymnasium.yaml").write_text(text)
    real = config.search_dirs
    monkeypatch.setattr(config, "search_dirs", lambda: [real()[0], tmp_path, *real()[1:]])


def test_keys_the_config_lacks_are_skipped_and_wildcards_apply_to_every_task(monkeypatch, tmp_path):
    _with_recommendation(monkeypatch, tmp_path, "task_key: env_id\nscratch:\n  '*':\n    ppo:\n"
                                                "      algo.epochs: 3\n      model.no_such_key: 1\n"
                                                "  Acrobot-v1:\n    ppo:\n      algo.epochs: 5\n")
    assert compose("rl", ["sim.env_id=MountainCar-v0"]).algo.epochs == 3
    cfg = compose("rl", ["sim.env_id=Acrobot-v1"])
    assert cfg.algo.epochs == 5 and list(cfg.recommended["keys"]) == ["algo.epochs"]  # the task's own entry wins


def test_task_family_patterns_sit_between_the_wildcard_and_the_task(monkeypatch, tmp_path):
    """A family entry (an fnmatch glob) wins over "*"; a narrower family over a wider one; the task's
    own entry over both; a user's override over all."""
    _with_recommendation(monkeypatch, tmp_path, "task_key: env_id\nscratch:\n"
                                                "  '*':\n    ppo:\n      algo.epochs: 3\n      algo.lr: 0.1\n"
                                                "  'Moun*':\n    ppo:\n      algo.epochs: 4\n      algo.gamma: 0.5\n"
                                                "  'MountainCar*':\n    ppo:\n      algo.epochs: 6\n"
                                                "  MountainCar-v0:\n    ppo:\n      algo.lr: 0.2\n")
    cfg = compose("rl", ["sim.env_id=MountainCar-v0"])
    assert (cfg.algo.epochs, cfg.algo.lr, cfg.algo.gamma) == (6, 0.2, 0.5)
    cfg = compose("rl", ["sim.env_id=MountainCarContinuous-v0"])  # the families, not the other task's entry
    assert (cfg.algo.epochs, cfg.algo.lr, cfg.algo.gamma) == (6, 0.1, 0.5)
    assert compose("rl", ["sim.env_id=Acrobot-v1"]).algo.epochs == 3
    assert compose("rl", ["sim.env_id=MountainCar-v0", "algo.epochs=9"]).algo.epochs == 9


def test_a_broken_recommendation_is_one_line_naming_it(monkeypatch, tmp_path):
    _with_recommendation(monkeypatch, tmp_path, "scratch:\n  CartPole-v1:\n    ppo:\n      algo.epochs: many\n")
    with pytest.raises(UserError) as err:
        compose("rl")
    msg = str(err.value)
    assert "recommended settings for gymnasium CartPole-v1, ppo are broken" in msg and "algo.epochs" in msg
    assert "\n" not in msg


def test_config_show_marks_where_values_came_from(cli):
    res = cli("config", "show", "rl", "algo.lr=5e-4", "seed=3")
    assert res.code == 0, res.err
    lines = res.out.splitlines()

    def line(key: str) -> str:
        return next(x for x in lines if x.strip().startswith(f"{key}:"))

    assert line("lr").endswith("# set") and line("seed").endswith("# set")
    assert line("rollout_steps").endswith("# task recommendation")
    assert line("clip_ratio").strip() == "clip_ratio: 0.2"  # a plain default: unmarked
    assert "gymnasium CartPole-v1, ppo" in res.out  # the `recommended` record at the end
    res = cli("config", "show", "rl", "sim.env_id=Acrobot-v1")
    assert "# task recommendation" not in res.out.split("\n", 3)[3]  # past the legend: nothing recommended


def test_a_run_says_which_settings_it_took(cli):
    res = cli("rl", "total_steps=256", "eval.episodes=0", "progress=false", "tracking.enabled=false", "run_dir=r")
    assert res.code == 0, res.err
    assert "recommended for gymnasium CartPole-v1, ppo: num_envs=8" in " ".join(res.err.split())
    assert "(any override wins)" in " ".join(res.err.split())


def test_metaworld_recommends_its_grpo_fine_tuning_settings_from_a_checkpoint():
    """Meta-World's recommendation is for fine-tuning a clone (its documented loop); from scratch
    GRPO keeps its plain defaults, and any override still wins."""
    cfg = compose("rl", ["sim=metaworld", "init=clone", "algo=grpo", "algo.epochs=3"])
    assert (cfg.algo.groups, cfg.algo.group_size, cfg.algo.filter_groups, cfg.algo.epochs) == (8, 4, True, 3)
    assert cfg.recommended["for"] == "metaworld reach-v3, grpo from a checkpoint"
    plain = compose("rl", ["sim=metaworld", "algo=grpo"])
    assert "recommended" not in plain and plain.algo.groups == compose("rl", ["algo=grpo"], recommend=False).algo.groups


def test_metaworld_grasping_families_get_more_envs_per_iteration_from_a_checkpoint():
    """Pick-* and peg-* tasks fine-tune with PPO at 64 envs over 400k env steps (the setting that
    lifted pick-place and peg-insert-side from 3-demo clones, docs/benchmarks.md); other tasks keep
    the plain defaults, from scratch nothing applies, and an override wins key by key."""
    rec = ("num_envs", "total_steps", "algo.critic_warmup_iters", "eval.interval", "eval.val_episodes")
    for task in ("push-v3", "reach-v3"):  # reach-v3: make demo's task, at its 100k steps
        plain = compose("rl", ["sim=metaworld", f"sim.task={task}", "init=clone", "algo=ppo"])
        assert "recommended" not in plain and plain.num_envs == 8
    for task in ("pick-place-v3", "peg-insert-side-v3", "pick-out-of-hole-v3"):
        cfg = compose("rl", ["sim=metaworld", f"sim.task={task}", "init=clone", "algo=ppo"])
        assert (cfg.num_envs, cfg.total_steps, cfg.algo.critic_warmup_iters) == (64, 400_000, 2)
        assert (cfg.eval.interval, cfg.eval.val_episodes) == (8, 20)
        assert cfg.recommended["for"] == f"metaworld {task}, ppo from a checkpoint"
        assert list(cfg.recommended["keys"]) == list(rec)
    cfg = compose("rl", ["sim=metaworld", "sim.task=pick-place-v3", "init=clone", "algo=ppo", "num_envs=16"])
    assert (cfg.num_envs, cfg.total_steps) == (16, 400_000) and "num_envs" not in cfg.recommended["keys"]
    scratch = compose("rl", ["sim=metaworld", "sim.task=pick-place-v3", "algo=ppo"])
    assert "recommended" not in scratch and scratch.num_envs == 8
    grpo = compose("rl", ["sim=metaworld", "sim.task=pick-place-v3", "init=clone", "algo=grpo"])
    assert grpo.algo.groups == 8 and "num_envs" not in grpo.recommended["keys"]  # the family entry is PPO's


def test_the_pipelines_short_rl_budget_gives_way_to_a_task_recommendation():
    """`rlinf pipeline` routes its own rl defaults (40k steps) first; where the task's fine-tuning
    recommendation sets the key (pick-* tasks: 400k at 64 envs), the recommendation wins, as it
    would for `rlinf rl init=`; the user's overrides win over both, and other tasks keep 40k."""
    from rlinf_cli.stages.pipeline import route, yield_to_recommendation

    grasp = route(["sim=metaworld", "sim.task=pick-place-v3"])["rl"]
    kept = yield_to_recommendation(grasp, ["init=clone"])
    assert "total_steps=40000" not in kept and "eval.episodes=0" in kept
    assert compose("rl", kept + ["init=clone"]).total_steps == 400_000
    mine = yield_to_recommendation(route(["sim=metaworld", "sim.task=pick-place-v3", "rl.total_steps=5000"])["rl"],
                                   ["init=clone"])
    assert compose("rl", mine + ["init=clone"]).total_steps == 5000
    push = yield_to_recommendation(route(["sim=metaworld", "sim.task=push-v3"])["rl"], ["init=clone"])
    assert compose("rl", push + ["init=clone"]).total_steps == 40_000
