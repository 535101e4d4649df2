"""MkDocs hook: the site's home page is the README, so the two never drift apart. The README
links the manual's pages as ``docs/<page>.md`` (as a repository browser reads them); on the
site those pages sit beside the home page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != "index.md":
        return markdown
    return README.read_text(encoding="utf-8").replace("](docs/", "](")
