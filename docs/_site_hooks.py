"""MkDocs hooks (``mkdocs.yml``): the site holds the pages of ``docs/`` and the two pages of the
repository that they link to, ``CHANGELOG.md`` and ``bench/README.md``.

Links are written for the repository, as GitHub shows the pages and as ``tests/api/test_docs.py``
checks them (``../bench/README.md`` from ``docs/``); each is mapped here to where its target
sits on the site. A link to anything else is left as written, for ``--strict`` to report.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
EXTRA = {"CHANGELOG.md": "changelog.md", "bench/README.md": "bench.md"}  # repository path: site path
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def on_files(files: Files, config: Any) -> Files:
    for repo, site in EXTRA.items():
        files.append(File.generated(config, site, abs_src_path=str(ROOT / repo)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    site_page = page.file.src_uri
    repo_page = next((repo for repo, site in EXTRA.items() if site == site_page), f"docs/{site_page}")

    def mapped(m: re.Match[str]) -> str:
        target = m.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return m.group(0)
        repo = posixpath.normpath(posixpath.join(posixpath.dirname(repo_page), target))
        site = EXTRA.get(repo) or (repo.removeprefix("docs/") if repo.startswith("docs/") else None)
        if site is None:
            return m.group(0)
        where = posixpath.relpath(site, posixpath.dirname(site_page) or ".")
        return f"{m.group(1)}{where}{m.group(3) or ''}{m.group(4)}"

    return LINK.sub(mapped, markdown)
