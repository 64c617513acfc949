"""How tests/integration/test_docs.py reads markdown: fences, the not-run marker (a reason is
required) and expected output."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import docs


def test_a_marker_skips_the_block_after_it_with_its_reason(tmp_path: Path) -> None:
    path = tmp_path / "doc.md"
    path.write_text(
        "x\n\n<!-- not-run: needs kubernetes -->\n```sh\nkubectl get pods\n```\n\n"
        "```python\nprint(1)\n```\n<!-- output -->\n```text\n1\n```\n"
    )
    first, second = docs.blocks(path)
    assert (first.lang, first.not_run, first.code) == (
        "sh",
        "needs kubernetes",
        "kubectl get pods\n",
    )
    assert (second.lang, second.not_run, second.output) == ("python", None, "1\n")


@pytest.mark.parametrize(
    "text",
    [
        "<!-- not-run: -->\n```sh\nls\n```\n",
        "<!-- not-run:    -->\n```sh\nls\n```\n",
        "<!-- not-run needs k8s -->\n```sh\nls\n```\n",
        "<!-- output -->\n```text\n1\n```\n",
    ],
)
def test_a_marker_without_a_reason_or_a_block_to_follow_is_refused(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "doc.md"
    path.write_text(text)
    with pytest.raises(ValueError):
        docs.blocks(path)


def test_expected_output_matches_lines_in_order_with_dots_for_any_text() -> None:
    out = "noise\nSUCCEEDED {'a': 1}\n01ABC SUCCEEDED\n"
    assert docs.output_matches("SUCCEEDED {'a': 1}\n... SUCCEEDED\n", out)
    assert not docs.output_matches("... SUCCEEDED\nSUCCEEDED {'a': 1}\n", out)
    assert not docs.output_matches("SUCCEEDED {'a': 2}\n", out)
    assert not docs.output_matches("5 b''\n", "5 b'{}'\n")
