"""ASGI entry point served by daphne: HTTP through Django, websockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conductor_web.settings.local")
# Django must be set up before the routing imports consumers (they import models).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from apps.api.mcp_endpoint import app as mcp_app  # noqa: E402
from apps.core import daphne_requests, daphne_ws  # noqa: E402
from apps.core.ws_auth import ParallelAuthMiddlewareStack  # noqa: E402
from apps.core.ws_origin import OriginCheck  # noqa: E402
from conductor_web.background import start_server_background  # noqa: E402
from conductor_web.handlers import ApiASGIHandler, http_application, with_api_headers  # noqa: E402
from conductor_web.routing import websocket_urlpatterns  # noqa: E402

daphne_requests.install()
daphne_ws.install()  # close frames carry their reason
start_server_background()

application = ProtocolTypeRouter(
    {
        # /v1 through its own all-async chain (conductor_web.handlers); the pages through Django's.
        # /mcp answers from the MCP SDK's transport, with /v1's security headers (issue 43).
        "http": http_application(django_asgi_app, ApiASGIHandler(), with_api_headers(mcp_app)),
        # Scheme, host and port of the Origin (apps.core.ws_origin), before any session read.
        "websocket": OriginCheck(ParallelAuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
