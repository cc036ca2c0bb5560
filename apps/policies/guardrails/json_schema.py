"""The final answer must be JSON matching the policy's schema.

Models often wrap JSON in a ```json fence; that fence is accepted. A non-JSON answer is an
intervention (the check worked; the answer failed it), not a broken check."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import jsonschema

from apps.policies.guardrails.base import Finding

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n\s*```\s*$", re.S | re.I)


@lru_cache(maxsize=64)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def scan(text: str, schema: dict[str, Any] | None) -> list[Finding]:
    if schema is None:
        raise ValueError("JSON schema check enabled without a schema")
    validator = _validator(json.dumps(schema, sort_keys=True))
    m = _FENCE.match(text)
    body = m.group(1) if m else text
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return [Finding("json_schema", 0, len(text), "the answer is not valid JSON")]
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
    if not errors:
        return []
    first = errors[0]
    where = "/".join(str(p) for p in first.path) or "(root)"
    # The validator's message may quote the offending value: keep the path and the rule only.
    rule = first.validator
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    return [Finding("json_schema", 0, len(text), f"JSON schema: '{rule}' failed at {where}{more}")]
