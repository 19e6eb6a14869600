"""mkdocs hooks: the on-disk specification in ``formats/`` and the scripts in ``examples/`` join the site.

The guides link to them as ``../formats/…`` and ``../examples/…`` (the paths that work when reading the
repository); on the site they sit at ``formats/…`` and ``examples/…`` beside the guides, so those links are
rewritten to match.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
EXTRA = {"formats": ("*.md", "*.json"), "examples": ("*.py",)}  # folder → the files of it the site gets


def on_files(files: Files, config: Any) -> Files:
    for folder, patterns in EXTRA.items():
        for path in sorted(p for pattern in patterns for p in (ROOT / folder).glob(pattern)):
            files.append(File(f"{folder}/{path.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri.startswith("formats/"):  # formats/x.md links a guide as ../docs/g.md; on the site: ../g.md
        return markdown.replace("](../docs/", "](../")
    return re.sub(r"\]\(\.\./(formats|examples)/", r"](\1/", markdown)
