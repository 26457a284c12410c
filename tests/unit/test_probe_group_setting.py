"""``probe.group`` and its old names (``admission``, ``roles``): the mapping and the refusals."""

from __future__ import annotations

import pytest

from raytrain_hetero.app.config import validate_config
from raytrain_hetero.config import ProbeConfig
from raytrain_hetero.errors import ConfigError


@pytest.mark.parametrize(
    ("old", "group"),
    [
        ({"admission": "all"}, "all"),
        ({"admission": "auto"}, "train"),
        ({"roles": "train"}, "all"),
        ({"roles": "auto"}, "auto"),
        ({"admission": "all", "roles": "train"}, "all"),
        ({"admission": "auto", "roles": "train"}, "train"),
        ({"admission": "auto", "roles": "auto"}, "auto"),
        ({"admission": "auto", "group": "train"}, "train"),
    ],
)
def test_the_old_names_map_onto_group(old, group):
    assert ProbeConfig(**old).group == group


def test_an_old_name_that_contradicts_group_is_one_line_naming_both():
    with pytest.raises(ConfigError) as caught:
        ProbeConfig(group="all", admission="auto")
    message = str(caught.value)
    assert "group: all" in message and "admission: auto" in message and "\n" not in message
    assert "remove the old key" in message


def test_admission_all_with_roles_auto_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="roles: auto.*group: auto"):
        ProbeConfig(admission="all", roles="auto")


def test_group_is_a_yaml_key_and_the_old_ones_still_are():
    base = {"data": {"root": "data/x"}, "workers": [{"name": "a"}, {"name": "b"}]}
    assert validate_config({**base, "probe": {"group": "train"}}).probe.group == "train"
    assert validate_config({**base, "probe": {"roles": "auto"}}).probe.group == "auto"
    with pytest.raises(ConfigError, match="probe"):
        validate_config({**base, "probe": {"group": "sometimes"}})
