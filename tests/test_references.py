"""Every reference in the package's text points at a section of docs/algorithms.md that exists."""

from __future__ import annotations

import re
from pathlib import Path

from adaptive_spec.verifiers import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
CITE = re.compile(r"docs/algorithms\.md §(\d+)")


def _sections() -> dict[int, str]:
    text = (ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8")
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^## (\d+)\. (.+)$", text, re.M)}


def _sources() -> list[Path]:
    return sorted((ROOT / "adaptive_spec").rglob("*.py")) + sorted((ROOT / "tests").rglob("*.py"))


def test_every_cited_section_exists() -> None:
    sections = _sections()
    assert len(sections) >= 10
    cited = 0
    for path in _sources():
        for n in CITE.findall(path.read_text(encoding="utf-8")):
            assert int(n) in sections, f"{path.relative_to(ROOT)} cites docs/algorithms.md §{n}, which does not exist"
            cited += 1
    assert cited > 30  # the verifiers, the analysis and the drafting code all cite it


def test_no_reference_outside_the_repository_or_without_its_file() -> None:
    here = Path(__file__).name
    for path in _sources():
        if path.name == here:
            continue
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        assert "shared/docs" not in text, f"{rel} cites a document outside the repository"
        bare = re.findall(r"(?<!docs/algorithms\.md )§\d+", text)
        assert not bare, f"{rel} cites {bare} without saying which document (write docs/algorithms.md §N)"


def test_each_verifier_cites_the_section_that_derives_it() -> None:
    sections = _sections()
    expected = {"token": 2, "greedy": 2, "block": 3, "traversal": 4, "specinfer": 5, "rrsw": 5, "spectr": 5,
                "nss": 5, "naive": 5, "gbv": 6, "hsd": 7}  # fmt: skip
    for name, spec in REGISTRY.items():
        n = int(spec.reference.removeprefix("docs/algorithms.md §"))
        assert n == expected[name] and n in sections, name
    assert "GBV" in sections[6] and "HSD" in sections[7] and "NaiveTree" in sections[5]
