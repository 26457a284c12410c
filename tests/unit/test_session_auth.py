"""driver/session.py: the embedded local Ray keeps token authentication on."""

from __future__ import annotations

import pytest

from raytrain_hetero.driver import session
from raytrain_hetero.errors import ConfigError


def test_an_embedded_ray_without_token_auth_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    assert not ray.is_initialized()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(ConfigError, match=r"RAY_AUTH_MODE=disabled.*Fix: unset RAY_AUTH_MODE"):
        session.init_ray()
    assert not ray.is_initialized()  # refused before anything started


@pytest.mark.parametrize("mode", [None, "token", "TOKEN"])
def test_token_mode_or_unset_passes_the_check(mode: str | None) -> None:
    environ = {} if mode is None else {"RAY_AUTH_MODE": mode}
    session._require_token_auth(environ)  # no error
