"""A log filter that masks anything shaped like a credential before it is written."""

from __future__ import annotations

import logging
import re

from apps.core.request_context import current_request_meta

# Common key shapes: OpenAI/Anthropic style keys, our own API keys, bearer tokens, key=value pairs.
_SECRET_PATTERNS = [
    re.compile(r"sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{8,}"),
    re.compile(r"cw_[A-Za-z0-9]{6,}_[A-Za-z0-9_\-]{16,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._\-]{12,}"),
    re.compile(r"(?i)((?:api[_-]?key|secret|token|password)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]{6,}"),
]


def redact(text: str) -> str:
    for pattern in _SECRET_PATTERNS:
        if pattern.groups:
            text = pattern.sub(lambda m: m.group(1) + "[REDACTED]", text)
        else:
            text = pattern.sub("[REDACTED]", text)
    return text


class RedactSecretsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string must not drop the record
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record: `` [req_…]`` while a /v1 request (or a run it started)
    is being handled, else empty. The ``plain`` formatter prints it after the logger name."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = current_request_meta().request_id
        record.request_id = f" [{request_id}]" if request_id else ""
        return True
