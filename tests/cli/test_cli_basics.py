"""The CLI's fast paths and its handling of bad overrides."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

NO_TORCH = """
import sys
from rlinf_cli.cli import main
try:
    main({argv!r})
except SystemExit as exc:
    assert not exc.code, exc.code
heavy = [m for m in ("torch", "mlflow", "hydra", "gymnasium", "transformers") if m in sys.modules]
assert not heavy, heavy
print("OK")
"""


@pytest.mark.parametrize("argv", [["--help"], ["plugins", "list"], ["plugins", "list", "--json"], ["rl", "--help"]])
def test_fast_paths_do_not_import_torch(argv):
    out = subprocess.run([sys.executable, "-c", NO_TORCH.format(argv=argv)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("OK")


def test_plugins_list_json_shows_every_bundled_kind(cli):
    res = cli("plugins", "list", "--json")
    assert res.code == 0
    rows = json.loads(res.out)
    names = {(r["kind"], r["name"]) for r in rows}
    for expected in [("simulator", "gymnasium"), ("model", "mlp"), ("algorithm", "ppo"), ("algorithm", "grpo"),
                     ("algorithm", "bc"), ("accelerator", "cpu"), ("accelerator", "cuda"), ("executor", "local"),
                     ("tool", "calculator"), ("tool", "python"), ("tool", "search")]:
        assert expected in names
    assert all(r["package"].startswith("rlinf") and r["version"] for r in rows)


def test_config_show_composes_plugin_groups_and_overrides(cli):
    res = cli("config", "show", "rl", "algo=grpo", "sim.env_id=Acrobot-v1", "total_steps=1e4")
    assert res.code == 0, res.err
    assert "name: grpo" in res.out and "clip_high: 0.28" in res.out
    assert "env_id: Acrobot-v1" in res.out
    assert "total_steps: 10000" in res.out  # an integral float fits an int key


def test_one_composition_equals_hydras_own_with_every_override_form():
    """compose() composes once and applies value overrides itself (Hydra's override step): the
    result must equal Hydra composing with all the overrides, for each override form."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from rlinf_cli.config import CORE_CONF, compose, search_dirs

    groups = ["sim=gymnasium", "model=mlp", "algo=ppo"]
    values = ["sim.env_id=Acrobot-v1", "algo.lr=1e-4", "total_steps=20000", "model.hidden_sizes=[8,8]",
              "+sim.extra_kw=3", "++algo.new_thing={a:1}", "++algo.gamma=0.9", "~eval.video", "eval.episodes=3"]
    ours = OmegaConf.to_container(compose("rl", groups + values), resolve=True)
    searchpath = "hydra.searchpath=[" + ",".join(f"file://{d}" for d in search_dirs()[1:]) + "]"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CORE_CONF), version_base="1.3"):
            chosen = [f"{g}={c}" for g, c in ours["choices"].items()]
            theirs = hydra_compose("rl", overrides=[searchpath, *chosen, *values])
    finally:
        GlobalHydra.instance().clear()
    theirs = OmegaConf.to_container(theirs, resolve=True)
    assert {k: v for k, v in ours.items() if k not in ("stage", "choices")} == theirs
    assert ours["sim"]["env_id"] == "Acrobot-v1" and ours["sim"]["extra_kw"] == 3
    assert ours["algo"]["new_thing"] == {"a": 1} and ours["algo"]["gamma"] == 0.9
    assert "video" not in ours["eval"] and ours["model"]["hidden_sizes"] == [8, 8]


def test_algo_option_is_sugar_for_the_override(cli, workdir):
    res = cli("rl", "--algo", "grpo", "total_steps=300", "algo.groups=1", "algo.group_size=2", "eval.episodes=1",
              "tracking.enabled=false", "run_dir=r")
    assert res.code == 0, res.err
    saved = (workdir / "r" / "rlinf.yaml").read_text()
    assert "name: grpo" in saved and "group_size: 2" in saved


@pytest.mark.parametrize(
    "args, needle",
    [
        (["rl", "algo.lrr=0.1"], "Did you mean 'algo.lr'"),
        (["rl", "algo.lr=abc"], "expected a number"),
        (["rl", "total_steps=1.5"], "expected an integer"),
        (["rl", "sim=isaaclab"], "pip install rlinf-sim-isaaclab"),
        (["rl", "--algo", "sacc"], "unknown algorithm 'sacc'"),
        (["rl", "algo.clip_ratio=-1"], "clip_ratio must be > 0"),
        (["rl", "algo.lr=["], "bad override"),
        (["sft", "algo=ppo", "dataset=x"], "dataset 'x' does not exist"),
        (["eval", "checkpoint=/no/such/dir"], "does not exist"),
        (["config", "show", "train"], "unknown stage 'train'"),
        (["collect", "policy=expert", "sim.env_id=Pendulum-v1", "output=d"], "no scripted expert"),
        (["rl", "accelerator=cuda"], "accelerator 'cuda' is not usable here"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cli_proc, args, needle):
    res = cli_proc(*args)
    assert res.code == 2, (res.code, res.err)
    lines = [l for l in res.err.strip().splitlines() if l.strip()]
    assert len(lines) == 1, res.err
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in res.err


def test_version(cli):
    res = cli("--version")
    assert res.code == 0 and res.out.startswith("rlinf ")


def test_check_sim_passes_for_a_bundled_simulator(cli):
    res = cli("check-sim", "sim.env_id=Pendulum-v1")
    assert res.code == 0, res.err
    assert "FAIL" not in res.out and res.out.count("pass") == 8
