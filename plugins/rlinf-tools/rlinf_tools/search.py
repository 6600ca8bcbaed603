"""The ``search`` tool: BM25 retrieval over a local folder of text files, indexed once per run.

The folder's ``.txt`` and ``.md`` files (recursively) are split into passages (paragraphs, long
ones into pieces of ``passage_words`` words), lower-cased words of letters and digits are the
terms, and a query's passages are ranked by Okapi BM25. Nothing leaves the machine.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rlinf_cli.api import ToolError, UserError, settings

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def terms(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class SearchConfig:
    folder: str | None = None  # the folder of documents, searched recursively; required
    extensions: tuple[str, ...] = (".txt", ".md")  # files indexed, by suffix
    top_k: int = 3  # passages returned per query (a call may ask for fewer with "k")
    passage_words: int = 120  # paragraphs longer than this are split into pieces of this many words
    max_files: int = 10000  # a larger folder is refused (the index lives in memory)
    result_chars: int = 1500  # characters of results returned, cut beyond
    k1: float = 1.5  # BM25 term-frequency saturation
    b: float = 0.75  # BM25 length normalisation

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.passage_words < 1 or self.max_files < 1 or self.result_chars < 1:
            raise ValueError("top_k, passage_words, max_files and result_chars must be >= 1")
        if self.k1 < 0 or not 0 <= self.b <= 1:
            raise ValueError("need k1 >= 0 and 0 <= b <= 1")


def passages(text: str, words: int) -> list[str]:
    """Paragraphs (blank-line separated), long ones cut into pieces of ``words`` words."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        split = para.split()
        out += [" ".join(split[i:i + words]) for i in range(0, len(split), words)]
    return out


class BM25Index:
    """Passages and an inverted index: term -> [(passage, term frequency)]."""

    def __init__(self, docs: list[tuple[str, str]], k1: float, b: float):
        self.docs = docs  # (source, passage text)
        self.k1, self.b = k1, b
        self.postings: dict[str, list[tuple[int, int]]] = {}
        self.lengths = []
        for i, (_src, text) in enumerate(docs):
            counts = Counter(terms(text))
            self.lengths.append(sum(counts.values()))
            for term, tf in counts.items():
                self.postings.setdefault(term, []).append((i, tf))
        self.avg = sum(self.lengths) / max(len(self.lengths), 1)

    def search(self, query: str, k: int) -> list[tuple[float, int]]:
        """The ``k`` best (score, passage) pairs, best first; passages sharing no term are left out."""
        n = len(self.docs)
        scores: dict[int, float] = {}
        for term in set(terms(query)):
            posting = self.postings.get(term, [])
            idf = math.log(1 + (n - len(posting) + 0.5) / (len(posting) + 0.5))
            for i, tf in posting:
                norm = tf + self.k1 * (1 - self.b + self.b * self.lengths[i] / max(self.avg, 1e-9))
                scores[i] = scores.get(i, 0.0) + idf * tf * (self.k1 + 1) / norm
        return sorted(((s, i) for i, s in scores.items()), key=lambda x: (-x[0], x[1]))[:k]


class SearchTool:
    """``search({"query": "boiling point of water"})`` -> the best passages, each with its file."""

    name = "search"
    description = "Searches local documents and returns the passages that best match the query, with their files."
    parameters = {"type": "object",
                  "properties": {"query": {"type": "string", "description": "words to look for"},
                                 "k": {"type": "integer", "description": "how many passages (at most the tool's top_k)"}},
                  "required": ["query"], "additionalProperties": False}
    timeout_s = 10.0
    example = {"query": "boiling point of water"}

    def __init__(self, cfg: Mapping[str, Any] | None = None):
        self.cfg = c = settings.build(SearchConfig, cfg, "sim.tool_options.search")
        if not c.folder:
            raise UserError("tool 'search' needs a folder of .txt/.md files: +sim.tool_options.search.folder=<dir>")
        root = Path(c.folder).expanduser()
        if not root.is_dir():
            raise UserError(f"sim.tool_options.search.folder '{c.folder}' is not a directory")
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in c.extensions)
        if not files:
            raise UserError(f"sim.tool_options.search.folder '{c.folder}' holds no {'/'.join(c.extensions)} files")
        if len(files) > c.max_files:
            raise UserError(f"sim.tool_options.search.folder '{c.folder}' holds {len(files)} files, more than "
                            f"max_files={c.max_files}; raise it or point at a smaller folder")
        docs = [(str(f.relative_to(root)), p) for f in files
                for p in passages(f.read_text(encoding="utf-8", errors="replace"), c.passage_words)]
        self.index = BM25Index(docs, c.k1, c.b)
        self.files = len(files)

    @staticmethod
    def example_config(workdir: Path) -> dict[str, Any]:
        """A small folder for the contract checks (``rlinf check-plugin search``)."""
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "water.md").write_text("Water boils at 100 degrees Celsius at sea level.\n")
        (workdir / "iron.txt").write_text("Iron melts at 1538 degrees Celsius.\n")
        return {"folder": str(workdir)}

    def describe(self) -> str:
        return f"search: {len(self.index.docs)} passages from {self.files} files under {self.cfg.folder}"

    def call(self, arguments: Mapping[str, Any]) -> str:
        query = str(arguments["query"])
        k = int(arguments.get("k", self.cfg.top_k))
        if k < 1:
            raise ToolError("k must be >= 1")
        hits = self.index.search(query, min(k, self.cfg.top_k))
        if not hits:
            return f"no passage matches {query[:80]!r}"
        text = "\n".join(f"[{n}] {self.index.docs[i][0]}: {self.index.docs[i][1]}" for n, (_s, i) in enumerate(hits, 1))
        return text if len(text) <= self.cfg.result_chars else text[:self.cfg.result_chars] + " [cut]"
