"""The README stays true: every setting is documented."""

from __future__ import annotations

from pathlib import Path

from app.core.config import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_setting_is_in_the_readme_configuration_table():
    text = README.read_text()
    section = text[text.index("## Configuration") :]
    section = section[: section.index("\n## ", 5)]
    missing = [
        f"CFT_{n.upper()}" for n in Settings.model_fields if f"`CFT_{n.upper()}`" not in section
    ]
    assert missing == []
