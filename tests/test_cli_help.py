"""``shardkit convert --help`` as a newcomer reads it (#43): examples and the common options first, every option
still listed, each once."""

from __future__ import annotations

import re

from click.testing import CliRunner

from shardkit.cli import convert, main


def test_convert_help_leads_with_examples_and_the_common_options() -> None:
    text = CliRunner().invoke(main, ["convert", "--help"], terminal_width=200).output
    sections = re.findall(r"^(\w[\w ]*) options:$", text, re.M)
    assert sections[0] == "Common" and len(sections) > 3, sections
    examples = text.index("Examples:")
    assert examples < text.index("Common options:")
    assert "shardkit convert raw/ out/ --dry-run" in text[examples:text.index("Common options:")]
    common = text[text.index("Common options:"):text.index(f"{sections[1]} options:")]
    listed = re.findall(r"^  (--[a-z-]+)", common, re.M)
    assert listed == list(convert.common) == ["--format", "--size", "--dry-run", "--split", "--classes", "--workers",
                                              "--config"]
    for param in convert.params:  # nothing dropped, nothing twice
        if param.param_type_name == "option":
            name = max(param.opts, key=len)
            row = rf"^  (?:-\w, )?(?:--[\w-]+(?:, |/))*{re.escape(name)}[ ,/\n]"  # an option's own row
            assert len(re.findall(row, text, re.M)) == 1, name
