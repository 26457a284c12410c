"""The rent pages' examples still match the code: every YAML block of a rent file validates as
one (tests/unit/test_docs.py checks job files; rent files share none of their top-level keys),
and the example rent file plans."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from raytrain_hetero.app.rent_schema import RentFile, load_rent_file

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "docs" / "how-to" / "rent.md", REPO / "docs" / "concepts" / "renting.md"]
FENCE = re.compile(r"^```yaml\n(?P<body>.*?)^```", re.M | re.S)


def _rent_blocks() -> list[tuple[str, dict]]:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            data = yaml.safe_load(match.group("body"))
            if isinstance(data, dict) and set(data) & set(RentFile.model_fields):
                line = text.count("\n", 0, match.start()) + 1
                out.append((f"{page.relative_to(REPO)}:{line}", data))
    return out


BLOCKS = _rent_blocks()


def test_the_how_to_has_a_rent_file():
    assert BLOCKS


@pytest.mark.parametrize(("where", "data"), BLOCKS, ids=[w for w, _ in BLOCKS])
def test_rent_yaml_blocks_validate(where, data):
    unknown = set(data) - set(RentFile.model_fields)
    assert not unknown, f"{where}: not rent file sections: {sorted(unknown)}"
    RentFile.model_validate(data)


def test_the_example_rent_file_loads():
    rf = load_rent_file(REPO / "examples" / "rent" / "resnet50_imagenet.yaml")
    assert rf.deadline_h == 3 and len(rf.cost_models) == 4
