"""Every websocket route of the project (the access-matrix test enumerates this list)."""

from apps.runs.routing import websocket_urlpatterns as run_routes

websocket_urlpatterns = [*run_routes]
