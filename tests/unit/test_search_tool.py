"""The search tool: BM25 over a folder the test writes, indexed once; the right document ranks first."""

from __future__ import annotations

import pytest

from rlinf_cli.api import ToolError
from rlinf_cli.errors import UserError
from rlinf_tools.search import BM25Index, SearchTool, passages

DOCS = {
    "volcano.md": "# Volcanoes\n\nMount Etna is an active volcano on Sicily. Its eruptions send lava down its slopes.\n\n"
                  "Lava is molten rock.",
    "kitchen/bread.txt": "Bread rises because yeast ferments sugar and releases carbon dioxide.\n\nBake it hot.",
    "orbit.md": "The Moon orbits the Earth every 27.3 days. The Earth orbits the Sun once a year.",
    "noise.txt": "The the the a a a of of of and and and is is is.",
    "skipped.csv": "volcano,volcano,volcano,lava,lava",  # not an indexed suffix
}


@pytest.fixture
def folder(tmp_path):
    for name, text in DOCS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("query, best", [
    ("which volcano erupts on Sicily", "volcano.md"),
    ("why does bread rise yeast", "kitchen/bread.txt"),
    ("how long does the moon take to orbit the earth", "orbit.md"),
])
def test_the_right_document_ranks_first(folder, query, best):
    tool = SearchTool({"folder": str(folder), "top_k": 2})
    out = tool.call({"query": query})
    lines = out.splitlines()
    assert lines[0].startswith(f"[1] {best}: "), out
    assert len(lines) <= 2 and "skipped.csv" not in out


def test_index_is_built_once_and_counts_passages(folder):
    tool = SearchTool({"folder": str(folder)})
    assert tool.files == 4 and len(tool.index.docs) == 7  # paragraphs: volcano 3, bread 2, orbit 1, noise 1
    (folder / "late.md").write_text("Volcano facts added after the index was built.")
    assert "late.md" not in tool.call({"query": "volcano facts"})  # once per run: no rescans per call


def test_k_and_no_match(folder):
    tool = SearchTool({"folder": str(folder), "top_k": 3})
    assert len(tool.call({"query": "the earth orbits", "k": 1}).splitlines()) == 1
    assert tool.call({"query": "zebra"}) == "no passage matches 'zebra'"
    with pytest.raises(ToolError, match="k must be >= 1"):
        tool.call({"query": "lava", "k": 0})


def test_bm25_prefers_rare_terms_and_long_paragraphs_split():
    index = BM25Index([("a", "common common common rare"), ("b", "common common common common")], 1.5, 0.75)
    assert [i for _, i in index.search("rare common", 2)][0] == 0
    assert passages("one two three four five", 2) == ["one two", "three four", "five"]


def test_a_missing_or_empty_folder_is_one_line(tmp_path):
    with pytest.raises(UserError, match="needs a folder"):
        SearchTool({})
    with pytest.raises(UserError, match="is not a directory"):
        SearchTool({"folder": str(tmp_path / "nope")})
    with pytest.raises(UserError, match="holds no .txt/.md files"):
        SearchTool({"folder": str(tmp_path)})
