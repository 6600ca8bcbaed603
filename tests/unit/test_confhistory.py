"""Versioned configuration: stored defaults per release, `config show --diff`, renamed keys."""

from __future__ import annotations

import copy

import pytest
import yaml

from rlinf_cli import config, confhistory
from rlinf_cli.config import STAGES


@pytest.fixture(scope="module")
def live() -> dict:
    return confhistory.snapshot()


def test_every_stored_release_has_every_stage(live):
    stored = confhistory.versions()
    assert stored, "no stored defaults: run make config-history"
    for version in stored:
        snap = confhistory.load(version)
        assert snap["version"] == version
        assert set(snap["stages"]) == set(STAGES)
        for stage, node in snap["stages"].items():
            for group, option in node["choices"].items():
                assert option in snap["groups"][group], (version, stage, group, option)
    assert set(live["stages"]) == set(STAGES)
    assert live["packages"]["rlinf-cli"] == live["version"]


def test_diff_finds_changed_added_removed_and_renamed_keys():
    old = {"a": 1, "b.c": "x", "gone": True, "algo.clip": 0.2}
    new = {"a": 2, "b.c": "x", "fresh": [1], "algo.clip_ratio": 0.2}
    rows = confhistory.diff(old, new, {"algo.clip": "algo.clip_ratio"})
    assert ("changed", "a", 1, 2) in rows
    assert ("added", "fresh", None, [1]) in rows
    assert ("removed", "gone", True, None) in rows
    assert ("renamed", "algo.clip -> algo.clip_ratio", 0.2, 0.2) in rows
    assert not any(r[1] == "b.c" for r in rows) and len(rows) == 4


@pytest.fixture
def history(tmp_path, monkeypatch, live):
    """A stored 'release 0.0.1' whose defaults differ from the installed ones in known ways."""
    monkeypatch.setattr(confhistory, "HISTORY", tmp_path)
    old = copy.deepcopy(live)
    old["version"] = "0.0.1"
    old["stages"]["rl"]["config"]["total_steps"] = 50000                 # changed since
    del old["stages"]["rl"]["config"]["checkpoint"]["keep"]               # added since
    old["stages"]["rl"]["config"]["legacy_flag"] = True                   # removed since
    old["groups"]["algo"]["ppo"]["lr"] = 1.0e-3                           # a plugin default changed
    old["stages"]["rl"]["choices"]["sim"] = "metaworld"                   # default option changed
    (tmp_path / "0.0.1.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    (tmp_path / "0.0.2.yaml").write_text(yaml.safe_dump({**old, "version": "0.0.2"}, sort_keys=False))
    return tmp_path


def test_config_show_diff_prints_what_changed_since_a_release(cli, history, live):
    res = cli("config", "show", "rl", "--diff", "0.0.1")
    assert res.code == 0, res.err
    out = res.out
    assert f"0.0.1 -> {live['version']} (installed)" in out
    assert "changed  total_steps: 50000 -> 100000" in out
    assert f"changed  algo.lr: 0.001 -> {live['groups']['algo']['ppo']['lr']}" in out
    assert "added    checkpoint.keep: 2" in out
    assert "removed  legacy_flag (was true)" in out
    assert f"default  sim: metaworld -> {live['stages']['rl']['choices']['sim']}" in out
    assert out.strip().endswith("4 difference(s)")
    # groups picked on the command line are compared as picked; two stored releases compare directly
    res = cli("config", "show", "rl", "--diff", "0.0.1..0.0.2", "--algo", "grpo")
    assert res.code == 0 and "algo=grpo" in res.out and res.out.strip().endswith("no differences"), res.out


def test_config_show_diff_bad_input_is_one_line(cli, history):
    res = cli("config", "show", "rl", "--diff", "9.9.9")
    assert res.code == 2
    assert "no stored defaults for version '9.9.9'; stored versions: 0.0.1, 0.0.2" in res.err
    res = cli("config", "show", "rl", "--diff", "0.0.1..")
    assert res.code == 2 and "bad --diff" in res.err
    res = cli("config", "show", "rl", "--diff", "0.0.1", "algo.lrr=1")
    assert res.code == 2 and "Did you mean 'algo.lr'" in res.err
    (history / "0.0.3.yaml").write_text("stages: [unclosed\n")
    res = cli("config", "show", "rl", "--diff", "0.0.3")
    assert res.code == 2 and "0.0.3.yaml' are damaged; reinstall rlinf-cli" in res.err


@pytest.fixture
def renamed(tmp_path, monkeypatch):
    """A plugin conf dir whose renamed.yaml renames two keys (one of them twice)."""
    import rlinf_cli.config as config

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "renamed.yaml").write_text(
        "renamed:\n"
        "  algo.learning_rate: algo.lr        # in 0.2.0\n"
        "  sim.env_name: sim.gym_id           # in 0.2.0\n"
        "  sim.gym_id: sim.env_id             # in 0.3.0\n")
    original = config.search_dirs
    monkeypatch.setattr(config, "search_dirs", lambda: [*original(), conf])
    return conf


def test_an_old_key_is_refused_naming_its_new_name(cli, renamed):
    assert config.renames()["sim.env_name"] == "sim.env_id"  # chains resolve to the newest name
    res = cli("rl", "algo.learning_rate=0.01")
    assert res.code == 2
    assert "config key 'algo.learning_rate' was renamed to 'algo.lr'; write algo.lr=... instead" in res.err
    assert res.err.count("\n") == 1 and "Traceback" not in res.err
    res = cli("config", "show", "eval", "sim.env_name=Pendulum-v1")
    assert res.code == 2 and "renamed to 'sim.env_id'" in res.err


def test_a_checkpoint_saved_before_a_rename_keeps_its_values(workdir, renamed):
    from rlinf_cli.config import compose, inherited_overrides

    ckpt = workdir / "old_ckpt"
    ckpt.mkdir()
    (ckpt / "rlinf.yaml").write_text(yaml.safe_dump({
        "stage": "rl", "choices": {"sim": "gymnasium"},
        "sim": {"name": "gymnasium", "env_name": "Pendulum-v1", "reward_scale": 0.5}}))
    overrides = ["checkpoint=old_ckpt"]
    cfg = compose("eval", overrides, inherited_overrides("eval", overrides))
    assert cfg.sim.env_id == "Pendulum-v1" and cfg.sim.reward_scale == 0.5
    assert "env_name" not in cfg.sim


def test_saved_strings_reach_the_next_stage_unchanged():
    """A checkpoint hands its settings on as overrides: a JSONL task's "{question}\\n" template, a
    "\\boxed{}" instruction, quotes and tabs come back character for character (JSON's escapes
    once turned the newline into a backslash and an n, one more each hop)."""
    from omegaconf import OmegaConf

    from rlinf_cli.config import compose, override_value

    strings = ["{question}\n", "Put the answer in \\boxed{}.", "it's \"x\"", "a\\", "tab\there", "C:\\new\\'q",
               "two\nlines\\n", "", "null", "[1,2]", " spaced "]
    for text in strings:
        cfg = compose("eval", ["sim=jsonl", "sim.path=x.jsonl", "checkpoint=random",
                               f"++sim.template={override_value(text)}"])
        assert cfg.sim.template == text
    for value in (["a\nb", "x\\y", 1, 2.5, None, True], {"k": "v\n", "n-m": [1, "2"]}):
        cfg = compose("eval", ["sim=jsonl", "sim.path=x.jsonl", "checkpoint=random",
                               f"++sim.extra={override_value(value)}"])
        assert OmegaConf.to_container(cfg.sim.extra) == value
