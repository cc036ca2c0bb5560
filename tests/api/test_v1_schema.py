"""``/v1`` in the OpenAPI schema and ``/api/docs/``: every protocol endpoint with its request and
response schemas, and a schema that still validates against the OpenAPI 3 meta-schema."""

from __future__ import annotations

from typing import Any

import pytest
from drf_spectacular.validation import validate_schema

from apps.api.urls import V1_ENDPOINTS

pytestmark = pytest.mark.django_db


def _schema(client: Any, user: Any) -> dict[str, Any]:
    client.force_login(user)
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def _resolve(schema: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith("#/components/schemas/"), ref
    return schema["components"]["schemas"][ref.rsplit("/", 1)[1]]


def test_every_v1_endpoint_is_documented_with_its_schemas(client: Any, owner: Any) -> None:
    schema = _schema(client, owner)
    validate_schema(schema)  # raises on any OpenAPI 3 meta-schema violation
    documented = {
        f"{method.upper()} {path}"
        for path, ops in schema["paths"].items()
        if path.startswith("/v1/")
        for method in ops
    }
    assert documented == set(V1_ENDPOINTS)
    for path, method, request_schema, response_schema in (
        ("/v1/chat/completions", "post", "V1ChatCompletionRequest", "V1ChatCompletion"),
        ("/v1/responses", "post", "V1ResponsesRequest", "V1Response"),
        ("/v1/messages", "post", "V1MessagesRequest", "V1Message"),
        ("/v1/models", "get", None, "V1ModelList"),
    ):
        op = schema["paths"][path][method]
        ok = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        assert ok.endswith(f"/{response_schema}") and _resolve(schema, ok)["required"]
        if request_schema:
            body = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert body.endswith(f"/{request_schema}")
            assert {"model"} <= set(_resolve(schema, body)["required"])
        assert op["security"] == [{"apiKey": []}]
    # Each protocol's own error shape.
    chat_err = schema["paths"]["/v1/chat/completions"]["post"]["responses"]["401"]
    msg_err = schema["paths"]["/v1/messages"]["post"]["responses"]["401"]
    assert chat_err["content"]["application/json"]["schema"]["$ref"].endswith("/V1Error")
    assert msg_err["content"]["application/json"]["schema"]["$ref"].endswith("/V1AnthropicError")
    # The REST API is still there, and the docs page groups /v1 under its own tag.
    assert "/api/runs/" in schema["paths"]
    assert any(tag["name"].startswith("v1") for tag in schema["tags"])
