"""The documentation site (docs/, mkdocs.yml) and the README that points into it.

The site builds with `mkdocs build --strict` (a broken link or anchor, a page outside the nav, a link leaving
docs/ fails it), every page is in the nav by our own count too, the state table is the ledger's transition table,
and the README stays a front door: what AGL is, the two commands, the picture, links that resolve.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from services.ledger import states

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
CONFIG = yaml.safe_load((REPO / "mkdocs.yml").read_text())


def nav_pages(entries: list) -> list[str]:
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(nav_pages(value) if isinstance(value, list) else [value])
    return pages


def test_the_site_builds_strict(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WARNING" not in result.stderr, result.stderr[-3000:]
    for page in nav_pages(CONFIG["nav"]):
        built = tmp_path / "site" / ("index.html" if page == "index.md" else page.removesuffix(".md") + "/index.html")
        if page.endswith("/index.md"):
            built = tmp_path / "site" / page.removesuffix("index.md") / "index.html"
        assert built.is_file(), page
    security = (tmp_path / "site" / "reliability" / "security" / "index.html").read_text()
    assert "Threat model" in security  # SECURITY.md is included, not a stale copy


def test_every_page_is_in_the_nav_once_and_every_nav_entry_is_a_page() -> None:
    listed = nav_pages(CONFIG["nav"])
    present = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
    assert len(listed) == len(set(listed)), "a page is in the nav twice"
    assert sorted(listed) == present
    # --strict fails only on what is a warning: these make a page outside the nav, a missing anchor and a link out
    # of docs/ warnings (mkdocs's defaults report the first two as info).
    assert CONFIG["strict"] is True
    for check in ("omitted_files", "not_found", "absolute_links", "unrecognized_links", "anchors"):
        assert CONFIG["validation"][check] == "warn", check


def test_the_state_table_is_the_ledgers_transition_table() -> None:
    text = (DOCS / "concepts" / "state-machine.md").read_text()
    lines = text[text.index("| state | may move to |") :].splitlines()[2:]
    table = {}
    for line in lines[: next(i for i, line in enumerate(lines) if not line.startswith("|"))]:
        state, moves = re.fullmatch(r"\| `(\w+)` \| (.*) \|", line).groups()
        table[state] = set(re.findall(r"`(\w+)`", moves))
    declared = {
        states.state_name(state): {states.state_name(t) for t in targets}
        for state, targets in states.TRANSITIONS.items()
    }
    assert table == declared
    assert f"`{states.state_name(states.RETRY_MOVE[0])} -> {states.state_name(states.RETRY_MOVE[1])}`" in text


def test_the_readme_is_a_front_door_whose_links_resolve() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 100, "the manual lives in docs/: keep the README to a screen or two"
    assert "make demo " in text and "make test " in text  # the two commands
    assert "WatchTerminal" in text and "CreateRollouts" in text  # the architecture picture
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert sum(link.startswith("docs/") for link in links) >= 20
    for link in links:
        if not link.startswith("http"):
            assert (REPO / link).is_file(), link
    # every page of the site is reachable from the README in one click
    assert {link.removeprefix("docs/") for link in links if link.startswith("docs/")} >= set(nav_pages(CONFIG["nav"]))
