"""Local fixture glue for the api tests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.core import LiveServer


@pytest.fixture
def api_server(transactional_db: Any, daphne_server: LiveServer) -> LiveServer:
    """The session's live daphne; tests that use it commit their data (transactional_db)."""
    return daphne_server
