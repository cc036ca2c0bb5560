"""OpenAPI extensions: how the schema describes API key authentication."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "apps.api.authentication.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "bearerFormat": "cw_<prefix>_<secret>",
            "description": "A team API key (Teams → API keys). It acts for its creator, limited to the key's "
            "team, role (read/run/admin) and allowed pools.",
        }
