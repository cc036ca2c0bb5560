"""Fake model-provider servers (real HTTP on loopback) and their pytest fixtures."""

from tests.fakes.anthropic_server import FakeAnthropicServer, anthropic_error
from tests.fakes.base import FakeError, FakeReply, RecordedRequest
from tests.fakes.openai_server import FakeOpenAIServer, openai_error

__all__ = [
    "FakeAnthropicServer",
    "FakeError",
    "FakeOpenAIServer",
    "FakeReply",
    "RecordedRequest",
    "anthropic_error",
    "openai_error",
]
