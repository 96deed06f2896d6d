"""The README stays a five-minute read and its links lead somewhere (mkdocs --strict in
`make lint` checks the links inside docs/; the README is outside the site)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_BYTES = 12 * 1024


def slug(heading: str) -> str:
    """The anchor mkdocs (and GitHub) give a heading, for the headings we write."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in page.read_text().splitlines()
            if re.match(r"#{1,6} ", line)}


def test_the_readme_is_at_most_12_kb() -> None:
    assert len(README.read_bytes()) <= MAX_BYTES


def test_the_readme_links_point_at_pages_and_sections_that_exist() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert len(local) > 10
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor:
            assert anchor in anchors(target), link


def test_the_readme_covers_install_use_and_troubleshooting() -> None:
    headings = [line[3:] for line in README.read_text().splitlines()
                if line.startswith("## ")]
    assert headings[:5] == [
        "Two commands", "Install", "Uninstalling", "Use", "How syncing works"]
    assert "When something is wrong" in headings


def test_the_readme_install_commands_name_paths_that_exist() -> None:
    """`helm install ... charts/himitsu-controller` and `kubectl apply -f deploy/...`:
    a newcomer copying them from the README must find the files."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    paths = {p for block in blocks
             for p in re.findall(r"(?<![\w/.-])((?:charts|deploy)/[\w./-]+)", block)}
    assert paths, "no install paths found"
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []
