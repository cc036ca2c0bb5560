"""Shared infrastructure every app may use: statements compiled once (``compiled``), database
connection handling (``executor_db``, ``backends``), input limits, request context, log filters,
middleware, the websocket session and Origin checks, CSV cell escaping, a small LRU.

It sits below every feature app and imports none of them (import-linter: "apps.core imports no
feature"); only ``apps.engine.text`` (the one ``BAD_CHARS``) is shared from below. Not a Django
app: it has no models, so it is not in ``INSTALLED_APPS``."""
