"""Every registered text task passes `rlinf check-sim`'s text-task contract."""

from __future__ import annotations

import json

import pytest

from rlinf_cli.checks import check_text_task
from rlinf_cli.registry import get_registry

TEXT_SIMS = sorted(n for n, s in get_registry().specs("simulator").items() if s.attrs.get("modality") == "text")


@pytest.mark.parametrize("name", TEXT_SIMS)
def test_text_task_contract(name, tmp_path):
    cfg = {"name": name}
    if name == "jsonl":
        path = tmp_path / "qa.jsonl"
        path.write_text("".join(json.dumps({"question": f"{i} plus {i}?", "answer": f"so {2 * i}\n#### {2 * i}"}) + "\n"
                                for i in range(300)))
        cfg["path"] = str(path)
    task = get_registry().load("simulator", name)(cfg)
    rows = check_text_task(task)
    failed = [r for r in rows if not r[1]]
    assert len(rows) == 6 and not failed, failed


def test_check_sim_reports_a_broken_text_task():
    from rlinf_sim_reasoning.tasks import ArithmeticTask

    class Leaky(ArithmeticTask):  # eval seeds that reuse training prompts
        def prompts(self, seeds):
            return super().prompts([s % 1000 for s in seeds])

    rows = {name: ok for name, ok, _ in check_text_task(Leaky({}))}
    assert rows["held-out eval seeds"] is False and rows["prompts by seed"] is True


def test_check_sim_cli_on_a_text_task(cli):
    r = cli("check-sim", "sim=calculator")
    assert r.code == 0, r.err
    assert "held-out eval seeds" in r.out and "FAIL" not in r.out
