from django.urls import path

from apps.runs.consumers import RunConsumer

websocket_urlpatterns = [
    path("ws/runs/<uuid:run_id>/", RunConsumer.as_asgi(), name="run-stream"),
]
