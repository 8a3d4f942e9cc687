"""Read back what report.html / compare.html hold: the tables (cell text and exact ``data-v`` values) and
the plotly figures' data, with the standard library only (what the page shows, independent of the code
that wrote it)."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, dict] = {}
        self._table = None
        self._cell = None
        self._row = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = {"headers": [], "rows": []}
            self.tables[attrs.get("id", f"table{len(self.tables)}")] = self._table
        elif self._table is not None and tag == "tr":
            self._row = []
        elif self._table is not None and tag in ("td", "th"):
            self._cell = {"text": "", "v": attrs.get("data-v"), "tag": tag, "title": attrs.get("title")}

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        elif self._table is not None and tag in ("td", "th") and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif self._table is not None and tag == "tr" and self._row is not None:
            if self._row and all(c["tag"] == "th" for c in self._row):
                self._table["headers"] = [c["text"] for c in self._row]
            else:
                self._table["rows"].append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data


def tables(text: str) -> dict[str, dict]:
    """``{table id: {"headers": [...], "rows": [[{"text", "v", "title"}, ...], ...]}}``."""
    parser = _Tables()
    parser.feed(text)
    return parser.tables


def column(table: dict, header_prefix: str, key: str = "v") -> list:
    """One column's ``data-v`` (or ``text``) values, by the start of its header."""
    (index,) = [i for i, h in enumerate(table["headers"]) if h.startswith(header_prefix)]
    return [row[index][key] for row in table["rows"]]


def figure(text: str, div_id: str) -> list[dict]:
    """The traces of the plotly figure in ``<div id=div_id>`` (the ``Plotly.newPlot`` call's data)."""
    m = re.search(r'Plotly\.newPlot\(\s*"%s",\s*' % re.escape(div_id), text)
    assert m, f"no figure {div_id}"
    data, _ = json.JSONDecoder().raw_decode(text, m.end())
    return data


def figure_layout(text: str, div_id: str) -> dict:
    """The layout of the plotly figure in ``<div id=div_id>`` (the ``Plotly.newPlot`` call's third argument)."""
    m = re.search(r'Plotly\.newPlot\(\s*"%s",\s*' % re.escape(div_id), text)
    assert m, f"no figure {div_id}"
    decoder = json.JSONDecoder()
    _, end = decoder.raw_decode(text, m.end())
    start = re.compile(r"\s*,\s*").match(text, end).end()
    return decoder.raw_decode(text, start)[0]


def figure_ids(text: str) -> list[str]:
    return re.findall(r'Plotly\.newPlot\(\s*"([\w-]+)"', text)
