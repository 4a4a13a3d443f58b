"""The documentation site builds with warnings as errors, its reference pages name everything the
code has (every GPUCR trait, CLI command, REST route and event property), and every relative link
in the Markdown files resolves. Nothing is fetched from the network."""
from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from traitlets import Undefined

from jupyter_gpucr.cli.main import _parser
from jupyter_gpucr.server.config import GPUCR
from jupyter_gpucr.server.lifecycle import event_schema

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs-html")
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
                           capture_output=True, text=True, timeout=170)
    assert build.returncode == 0, build.stderr
    return out


def text_of(site: Path, page: str) -> str:
    """The page's visible text, tags dropped, Sphinx's typographic quotes made plain again."""
    text = html.unescape(re.sub(r"<[^>]+>", "", (site / page).read_text()))
    return text.translate(str.maketrans("‘’“”", "''\"\""))


def test_configuration_page_has_every_trait_with_its_default_and_help(site: Path) -> None:
    page = text_of(site, "configuration.html")
    missing = []
    for name, trait in GPUCR.class_traits(config=True).items():
        help_start = " ".join(trait.help.split())[:40]
        if f"c.GPUCR.{name} = " not in page or help_start not in " ".join(page.split()):
            missing.append(name)
        elif trait.default_value is not Undefined and repr(trait.default_value) not in page:
            missing.append(f"{name} (default {trait.default_value!r})")
    assert missing == []


def test_cli_page_has_every_command_and_option(site: Path) -> None:
    page = text_of(site, "cli-reference.html")
    sub = next(a for a in _parser()._actions if a.dest == "cmd")
    missing = [f"gpucr {name}" for name in sub.choices if f"gpucr {name} [-h]" not in " ".join(page.split())]
    missing += [f"{name} {opt}" for name, p in sub.choices.items() for a in p._actions
                for opt in a.option_strings if opt.startswith("--") and a.dest != "help" and opt not in page]
    assert missing == []


def test_rest_page_has_every_route_and_the_error_shape(site: Path) -> None:
    page = text_of(site, "rest-api.html")
    spec = yaml.safe_load((DOCS / "rest-api.yaml").read_text())
    missing = [f"{m.upper()} {p}" for p, ops in spec["paths"].items() for m in ops
               if m in ("get", "put", "post", "delete") and not re.search(rf"{m.upper()}\s*{re.escape(p)}", page)]
    assert missing == []
    assert all(field in page for field in ("message", "hint", "KernelBusyError"))


def test_events_page_has_every_event_property(site: Path) -> None:
    page = text_of(site, "events.html")
    assert [name for name in event_schema()["properties"] if name not in page] == []


def markdown_files() -> list[Path]:
    return [*sorted(DOCS.rglob("*.md")), ROOT / "README.md", ROOT / "CHANGELOG.md"]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # links in code blocks are code
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # external URLs are not fetched; anchors in the page are Sphinx's to check
        if not (path.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert broken == []
