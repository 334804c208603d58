"""Comments cite docs/architecture.md by section: every cited section exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"docs/architecture\.md §(\d+)(?:\.(\d+))?")
SOURCES = ("*.py", "*.js", "*.html", "*.css", "*.md")
SKIP = {".venv", "var", "vendor", "node_modules", ".git"}


def _sections() -> dict[str, str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    parts = re.split(r"^## (\d+)\. .*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _citations() -> list[tuple[str, str, str | None]]:
    found = []
    for pattern in SOURCES:
        for path in ROOT.rglob(pattern):
            if SKIP & set(path.relative_to(ROOT).parts):
                continue
            for match in CITATION.finditer(path.read_text(errors="replace")):
                section, step = match.groups()
                found.append((str(path.relative_to(ROOT)), section, step))
    return found


def test_sections_one_to_nine_exist_in_order():
    assert list(_sections()) == [str(n) for n in range(1, 10)]


def test_every_citation_names_an_existing_section_and_step():
    sections, citations = _sections(), _citations()
    assert len(citations) > 40  # the tree does cite it
    missing = []
    for where, section, step in citations:
        body = sections.get(section)
        if body is None or (step and not re.search(rf"^{step}\. ", body, re.M)):
            missing.append(f"{where}: §{section}{'.' + step if step else ''}")
    assert missing == []
