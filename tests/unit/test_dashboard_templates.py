"""The dashboard's HTML comes from one autoescaping template engine, and the templates ship."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from app.dashboard import templating

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "app" / "dashboard" / "templates"
# Markup built in Python: an HTML or SVG tag in a line of code, or a call of (html.)escape.
TAGS = (
    "a|b|body|br|button|code|details|div|form|h[1-6]|head|header|html|input|label|li|link|main"
    "|meta|nav|option|p|polygon|polyline|pre|rect|script|section|select|span|style|summary|svg"
    "|table|td|text|th|title|tr|ul"
)
HTML_IN_PYTHON = re.compile(rf"</?(?:{TAGS})[\s>/]|\bescape\(")


def test_every_template_compiles_and_autoescapes() -> None:
    assert templating.ENV.autoescape is True
    names = templating.ENV.list_templates()
    assert {p.name for p in TEMPLATES.iterdir()} == set(names)
    for name in names:
        templating.ENV.get_template(name)
    ui = templating.ENV.get_template("_macros.html").module
    html = str(ui.link("/dashboard?a=1&b=2", "<script>x</script>"))  # type: ignore[attr-defined]
    assert html == '<a href="/dashboard?a=1&amp;b=2">&lt;script&gt;x&lt;/script&gt;</a>'


def test_no_html_is_built_in_python() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "app").rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if HTML_IN_PYTHON.search(line)
    ]
    assert found == [], "render markup through app/dashboard/templates:\n" + "\n".join(found)


def test_an_installed_package_carries_the_templates() -> None:
    """pyproject's package data names every template (a wheel holds only what it names)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]["app.dashboard"]
    for path in TEMPLATES.iterdir():
        rel = str(path.relative_to(ROOT / "app" / "dashboard"))
        assert any(fnmatch.fnmatch(rel, g) for g in globs), rel
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(re.match(r"jinja2\b", d, re.I) for d in project["dependencies"])
