"""The docs stay true: every setting is documented and the site builds with no broken link."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from app.core.config import Settings

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"
README = ROOT / "README.md"


def test_every_setting_is_in_the_configuration_table():
    text = CONFIGURATION.read_text()
    missing = [
        f"CFT_{n.upper()}" for n in Settings.model_fields if f"`CFT_{n.upper()}`" not in text
    ]
    assert missing == [], f"add a row to the table in {CONFIGURATION.relative_to(ROOT)}"


def test_docs_site_builds_strictly(tmp_path: Path):
    # --strict turns every warning into a failure: a broken link or #anchor, a page missing
    # from the nav or a nav entry with no page. Not -q: it hides the warnings, so nothing fails.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_readme_is_a_front_page_whose_links_resolve():
    # mkdocs checks the links inside docs/; README's own links into docs/ are checked here.
    text = README.read_text()
    assert len(text.splitlines()) <= 250, "README is the front page: move guide text into docs/"
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "README links to no guide"
    broken = [t for t in local if not (ROOT / t).exists()]
    assert broken == []
