"""``data.source: ray_data`` refuses what it cannot feed, in one line naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raytrain_hetero.app.config import validate_config
from raytrain_hetero.app.ray_data_source import check_ray_data_job
from raytrain_hetero.errors import ConfigError

EXAMPLE = Path(__file__).parents[2] / "examples" / "configs" / "eurosat_ray_data_local.yaml"


def _job(tmp_path, **data):
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["data"].update(root=str(tmp_path), **data)
    return validate_config(raw, source="test")


def test_the_example_is_a_ray_data_job(tmp_path):
    job = _job(tmp_path)
    assert job.data.source == "ray_data"
    check_ray_data_job(job)  # nothing to refuse


@pytest.mark.parametrize(
    ("data", "named"), [({"cache": True}, "data.cache"), ({"num_workers": 2}, "data.num_workers")]
)
def test_file_source_settings_are_refused(tmp_path, data, named):
    with pytest.raises(ConfigError, match=named):
        check_ray_data_job(_job(tmp_path, **data))


def test_an_unknown_source_is_refused_when_read(tmp_path):
    with pytest.raises(ConfigError, match="source"):
        _job(tmp_path, source="ray-data")
