"""The values docs/deploying.md shows are values the chart takes: each of its yaml blocks,
given to the real `helm template`, renders (the schema and validateValues accept it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helm.conftest import ROOT, run_helm, template_args
from tests.support import docs

DEPLOYING = ROOT / "docs" / "deploying.md"
VALUES_BLOCKS = [b for b in docs.blocks(DEPLOYING) if b.lang == "yaml"]


def test_the_guide_shows_values() -> None:
    assert len(VALUES_BLOCKS) >= 3, [b.id for b in VALUES_BLOCKS]


@pytest.mark.parametrize("block", VALUES_BLOCKS, ids=[b.id for b in VALUES_BLOCKS])
def test_every_values_block_of_the_guide_renders(
    helm: str, block: docs.Block, tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(block.code)
    proc = run_helm(helm, *template_args([values]))
    assert proc.returncode == 0, f"{block.id}: helm template refuses it:\n{proc.stderr}"
