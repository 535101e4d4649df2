"""The report's files: Markdown, self-contained HTML (the charts inlined), ``summary.csv``,
the forecast check's CSVs and the charts."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from idlegpu.forecast.tables import write_csv
from idlegpu.scheduler.reports.build import Report
from idlegpu.scheduler.reports.charts import write_charts
from idlegpu.scheduler.reports.sections import _sections

_MD_SPECIAL = str.maketrans({
    **{c: "\\" + c for c in "\\`*_[]|#$~"}, "<": "&lt;", ">": "&gt;", "&": "&amp;"})


def markdown_text(text: str) -> str:
    """``text`` as Markdown shows it literally: HTML and emphasis, link, code, table, math
    and strike-through characters escaped (a team or service called ``<script>``, ``a_b*c``
    or ``a$b^{$c`` stays that)."""
    return str(text).translate(_MD_SPECIAL)


def _markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    align = ["---"] + ["---:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(markdown_text(h) for h in headers) + " |",
             "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(markdown_text(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"



def render_markdown(report: Report, charts: dict[str, Path]) -> str:
    parts = []
    for kind, payload in _sections(report, charts):
        if kind == "h1":
            parts.append(f"# {markdown_text(payload)}")
        elif kind in ("h2", "h3"):
            parts.append(f"{'#' * int(kind[1])} {markdown_text(payload)}")
        elif kind == "code":
            parts.append("```sh\n" + payload + "\n```")
        elif kind == "list":
            parts.append("\n".join(f"- {line}" for line in payload))
        elif kind == "table":
            parts.append(_markdown_table(*payload))
        elif kind == "text":
            parts.append(markdown_text(payload))
        elif kind == "chart":
            title, path = payload
            text = markdown_text(title)
            parts.append(f"### {text}\n\n![{text}]({path.name})")
    return "\n\n".join(parts) + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #4C72B0;padding-bottom:.2em}
h2{font-size:1.25em;margin-top:1.6em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}
th{background:#f0f3f8}
tr:nth-child(even) td{background:#fafafa}
img{max-width:100%;border:1px solid #eee}
pre{background:#f6f6f6;padding:.7em;overflow-x:auto}
p.note{color:#555;font-size:.9em}
"""


def render_html(report: Report, charts: dict[str, Path]) -> str:
    body = []
    for kind, payload in _sections(report, charts):
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{html.escape(payload)}</{kind}>")
        elif kind == "code":
            body.append(f"<pre><code>{html.escape(payload)}</code></pre>")
        elif kind == "list":
            items = "".join(f"<li>{_bold(html.escape(line))}</li>" for line in payload)
            body.append(f"<ul>{items}</ul>")
        elif kind == "table":
            body.append(_html_table(*payload))
        elif kind == "text":
            body.append(f'<p class="note">{html.escape(payload)}</p>')
        elif kind == "chart":
            title, path = payload
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            body.append(f"<h3>{html.escape(title)}</h3>"
                        f'<img alt="{html.escape(title)}" src="data:image/png;base64,{data}">')
    title = html.escape(f"{report.pool}: harvested GPUs, {report.month.label}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _bold(text: str) -> str:
    parts = text.split("**")
    return "".join(f"<strong>{p}</strong>" if k % 2 else p for k, p in enumerate(parts))


def write_summary_csv(report: Report, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_csv(report.summary, path, decimals=6)
    return path


def write_report(report: Report, out: Path, *, dpi: int = 100) -> list[Path]:
    """Write ``report-YYYY-MM.md``, ``report-YYYY-MM.html``, ``summary.csv``, with a forecast
    check ``report-YYYY-MM_coverage.csv`` and ``report-YYYY-MM_coverage_daily.csv``, and the
    charts into ``out``; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    charts = write_charts(report, out, dpi=dpi)
    label = report.month.label
    md = out / f"report-{label}.md"
    md.write_text(render_markdown(report, charts), encoding="utf-8")
    page = out / f"report-{label}.html"
    page.write_text(render_html(report, charts), encoding="utf-8")
    summary = write_summary_csv(report, out / "summary.csv")
    extra = write_coverage_csv(report, out) if report.forecast is not None else []
    return [md, page, summary, *extra, *charts.values()]


def write_coverage_csv(report: Report, out: Path) -> list[Path]:
    """The forecast check per service (``report-YYYY-MM_coverage.csv``,
    ``SERVICE_COVERAGE_COLUMNS``) and per evening and service
    (``report-YYYY-MM_coverage_daily.csv``, ``DAILY_COVERAGE_COLUMNS``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    label = report.month.label
    check = report.forecast
    assert check is not None  # write_report calls it only with a forecast check
    services = out / f"report-{label}_coverage.csv"
    write_csv(check.services, services, decimals=6)
    daily = out / f"report-{label}_coverage_daily.csv"
    write_csv(check.daily, daily, tz=report.tz, decimals=6)
    return [services, daily]

