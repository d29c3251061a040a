"""The manual holds together: every relative link in README.md and docs/ reaches a file that
exists (and, into a Markdown page, a heading that exists, by GitHub's anchor rule), and the
README stays an entry page rather than growing back into the whole manual."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"
# issue 21: the README is an entry page of about 15 KB; the rest lives in docs/ by topic
README_MAX_BYTES = 15_500

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) or [text](target "title"); images too, which is what we want
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


def strip_code(text: str) -> str:
    """The text without fenced blocks and code spans: links shown as code are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lowercased, every character that is not
    a letter, digit, space, hyphen or underscore dropped, spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor in a page; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for match in HEADING.finditer(FENCE.sub("", markdown)):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path, text: str) -> list[str]:
    """One line per relative link in `text` (the content of `page`) that reaches nothing."""
    problems: list[str] = []
    for target in LINK.findall(strip_code(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:: not ours to check
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            problems.append(f"{page.name}: {target}: no such file")
            continue
        if fragment and dest.suffix == ".md":
            content = text if dest == page else dest.read_text()
            if fragment not in anchors(content):
                problems.append(f"{page.name}: {target}: no heading with anchor #{fragment}")
    return problems


def pages() -> list[Path]:
    return [README, *sorted((REPO_ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page, page.read_text()) == []


def test_the_readme_is_an_entry_page() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes: move detail into docs/"
    text = README.read_text()
    # the two commands come first
    assert text.index("make demo") < text.index("make test") < text.index("## ")
    # and every docs page is reachable from it, directly or through a page it links
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in LINK.findall(strip_code(text))}
    reached = set(linked)
    for page in linked:
        if page.suffix == ".md" and page.exists():
            found = LINK.findall(strip_code(page.read_text()))
            reached |= {(page.parent / t.partition("#")[0]).resolve() for t in found}
    unreached = [p.relative_to(REPO_ROOT) for p in pages()[1:] if p.resolve() not in reached]
    assert unreached == [], "docs pages no page links to"


def test_the_checker_finds_a_dangling_link(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A heading, with `code`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    text = (
        "[ok](there.md) [ok](there.md#a-heading-with-code) [ok](there.md#twice-1) [ok](#local)\n"
        "[gone](missing.md) [no anchor](there.md#nowhere) [no local](#elsewhere)\n"
        "`[in code](missing-too.md)` [web](https://example.org/x)\n\n"
        "```\n[in a block](missing-three.md)\n```\n\n# Local\n"
    )
    page.write_text(text)
    assert broken_links(page, text) == [
        "page.md: missing.md: no such file",
        "page.md: there.md#nowhere: no heading with anchor #nowhere",
        "page.md: #elsewhere: no heading with anchor #elsewhere",
    ]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("`kilonode plan`: the same program, no cloud", "kilonode-plan-the-same-program-no-cloud"),
        ("Times (2 cores, qemu under TCG)", "times-2-cores-qemu-under-tcg"),
        ("What `pulumi up` does, in order", "what-pulumi-up-does-in-order"),
        ("GPU pools: driver, runtime, device plugin", "gpu-pools-driver-runtime-device-plugin"),
    ],
)
def test_anchors_follow_githubs_rule(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor
