"""Fixtures for the drop-in client tests (issue 22): the live daphne of ``tests/api`` and clients.

``V1_CORS_ALLOWED_ORIGINS`` is set before the session's daphne starts (conftest modules are
imported at collection, fixtures run later), so the CORS tests have one allowed origin.
"""

from __future__ import annotations

import os
from typing import Any

import openai
import pytest

from tests.api.conftest import api_server  # noqa: F401  (the live daphne; re-exported)

ALLOWED_ORIGIN = "https://app.example.test"
os.environ.setdefault("V1_CORS_ALLOWED_ORIGINS", ALLOWED_ORIGIN)


@pytest.fixture
def sdk(api_server: Any, runtime_workers: Any, api_key: tuple[Any, str]) -> openai.OpenAI:  # noqa: F811
    """The official OpenAI client on the live server with alpha's run key (no retries: a retried
    error would hide the status a test asserts)."""
    return openai.OpenAI(base_url=f"{api_server.url}/v1", api_key=api_key[1], max_retries=0, timeout=90)


@pytest.fixture
def async_sdk(api_server: Any, runtime_workers: Any, api_key: tuple[Any, str]) -> openai.AsyncOpenAI:  # noqa: F811
    return openai.AsyncOpenAI(base_url=f"{api_server.url}/v1", api_key=api_key[1], max_retries=0, timeout=90)
