"""A griffe extension for the API reference: the docstrings' Sphinx roles (``:class:`~shardkit.Dataset```,
``:meth:`on_epoch_end```) become Markdown code (`Dataset`, `on_epoch_end`), so the pages read as text."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const):`~?([^`]+)`")


def _short(match: re.Match[str]) -> str:
    target = match.group(1)
    return f"`{target.rsplit('.', 1)[-1] if match.group(0).count('~') else target}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_short, obj.docstring.value)
