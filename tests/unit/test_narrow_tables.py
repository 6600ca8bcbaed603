"""Tables meant for a terminal stay readable at 80 columns: every row fits in a line or two, and
what does not fit a cell (reasons, instructions, install commands) is printed whole under it."""

from __future__ import annotations

import io

from rich_tables import cells, table_rows

WIDTH = 80


def render(renderable) -> str:
    from rich.console import Console

    console = Console(width=WIDTH, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def assert_fits(text: str, rows: list[list[str]]) -> None:
    assert rows, text
    for row in rows:
        assert len(row) <= 2, "\n".join(row)
    table_lines = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert all(len(line) <= WIDTH for line in table_lines), text


def test_doctor_fits_80_columns_and_prints_install_commands_whole(cli_proc):
    from rlinf_cli.doctor import accelerator_rows

    res = cli_proc("doctor", env={"COLUMNS": str(WIDTH)})
    assert res.code == 0 and "Traceback" not in res.err, res.err
    rows = table_rows(res.out)
    assert_fits(res.out, rows)
    assert {cells(r)[0] for r in rows} >= {"cpu", "cuda", "rocm", "ascend", "musa"}
    hints = [r["install"] for r in accelerator_rows() if r["install"]]
    assert hints  # this CPU machine lacks every GPU runtime: each backend says how to get it
    after = res.out.split("└", 1)[1].splitlines()
    for hint in hints:
        assert any(line.strip() == f"install: {hint}" for line in after), (hint, res.out)


def _summary(i: int) -> dict[str, float]:
    return {"episodes": 40.0, "return_mean": 1234.5 - i, "return_std": 456.7, "success_once": 0.975,
            "success_at_end": 0.5, "length_mean": 187.3}


def test_eval_table_with_instructions_fits_80_columns():
    from rlinf_cli.collectors.embodied_eval import eval_table

    tasks = ["pick-place-wall-v3", "button-press-topdown-v3", "door-open-v3"]
    rows = {f"best · {t}": _summary(i) for i, t in enumerate(tasks)}
    told = {label: f"do the long task number {i}, carefully and with both hands, then stop and wait"
            for i, label in enumerate(rows)}
    rows["best · mean over 3 tasks"] = _summary(9)
    text = render(eval_table(rows, "rlinf eval: metaworld/3 tasks (seeds 1000000..1000039)", told))
    body = table_rows(text)
    assert_fits(text, body)
    assert len(body) == 4 and all("40" in cells(r) for r in body)
    below = text.split("└", 1)[1]
    assert "success_once" in below and "success_at_end" in below  # the legend names the result keys
    for label, instruction in told.items():  # each instruction whole, with its row's label
        assert f"{label}: {instruction}" in " ".join(below.split()), below


def test_pipeline_summary_fits_80_columns():
    from rlinf_cli.stages.pipeline import _summary as pipeline_summary

    summaries = {label: _summary(i) for i, label in enumerate(("random", "expert", "sft", "sft + rl"))}
    text = render(pipeline_summary("rlinf pipeline: metaworld/reach-v3", summaries,
                                   {"expert": 0.0, "collect": 12.0, "sft": 95.0, "rl": 1234.0}))
    body = table_rows(text)
    assert_fits(text, body)
    assert [cells(r)[0] for r in body] == ["random", "expert", "sft", "sft + rl"]
    assert all(len(r) == 1 for r in body), text  # these short labels: one line each
    assert cells(body[3])[-1] == "1234 s"


def test_plugins_list_fits_80_columns(cli_proc):
    res = cli_proc("plugins", "list", env={"COLUMNS": str(WIDTH)})
    assert res.code == 0, res.err
    rows = table_rows(res.out)
    assert_fits(res.out, rows)
    assert all(len(r) == 1 for r in rows), res.out
    assert "--json" in res.out  # where the summaries that did not fit are
    wide = cli_proc("plugins", "list", env={"COLUMNS": "250"})
    assert all(len(r) == 1 for r in table_rows(wide.out)) and "summary" in wide.out
