"""mkdocs hooks: the on-disk specification in ``formats/`` and the scripts in ``examples/`` join the site.

The guides link to them as ``../formats/…`` and ``../examples/…`` (the paths that work when reading the
repository); on the site they sit at ``formats/…`` and ``examples/…`` beside the guides, so those links are
rewritten to match. A page's ``<!-- convert-options -->`` becomes the table of :class:`ConvertConfig`'s options,
built from their declarations (name, type, default, flag, help), so the API reference never restates them.
"""

from __future__ import annotations

import dataclasses
import html
import re
import sys
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


def convert_options_table() -> str:
    """Every ``shardkit convert`` option as :class:`ConvertConfig` declares it, one table per ``--help`` group."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's shardkit, not another installed copy
    from shardkit.conversion.config import GROUPS, cli_options

    def cell(text: str) -> str:  # one line of plain text in a table cell
        return html.escape(" ".join(text.split())).replace("|", "&#124;")

    out = []
    for group, heading in GROUPS.items():
        out += [f"**{heading}**", "", "| field | type | default | option | what it does |", "|---|---|---|---|---|"]
        for fld, spec in cli_options():
            if spec.group != group:
                continue
            default = ("(empty)" if fld.default_factory is not dataclasses.MISSING
                       else "(required)" if fld.default is dataclasses.MISSING else repr(fld.default))
            flag = (spec.flags or ("--" + fld.name.replace("_", "-"),))[0]
            out.append(f"| `{fld.name}` | `{fld.type}` | `{default}` | `{flag}` | "
                       f"{cell(spec.help_text())} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if "<!-- convert-options -->" in markdown:
        markdown = markdown.replace("<!-- convert-options -->", convert_options_table())
    if page.file.src_uri.startswith("formats/"):  # formats/x.md links a guide as ../docs/g.md; on the site: ../g.md
        return markdown.replace("](../docs/", "](../")
    return re.sub(r"\]\(\.\./(formats|examples)/", r"](\1/", markdown)
