"""Fixtures for the provider's tests (see ``provider_world``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from provider_world import World, make_world


@pytest.fixture
def world() -> World:
    return make_world()


@pytest.fixture
def world_factory() -> Callable[..., World]:
    return make_world
