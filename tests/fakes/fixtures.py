"""pytest fixtures for the fake provider servers (no Django needed).

Use from a conftest.py:  `from tests.fakes.fixtures import openai_fake, anthropic_fake  # noqa: F401`

Each fixture yields a started server (fresh per test) and stops it afterwards. Set
`server.responder = lambda req: ...` or `server.script(...)` inside the test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.anthropic_server import FakeAnthropicServer
from tests.fakes.openai_server import FakeOpenAIServer


@pytest.fixture
def openai_fake() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def anthropic_fake() -> Iterator[FakeAnthropicServer]:
    server = FakeAnthropicServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
