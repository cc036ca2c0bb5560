"""Test settings. The mode follows the environment exactly like production would:
DATABASE_URL / REDIS_URL / CELERY_BROKER_URL set → distributed, unset → embedded."""

import sys
from typing import Any, cast

from .base import *  # noqa: F403
from .base import CHANNEL_LAYERS, DATABASES, VAR_DIR, env

# Lets several test sessions share one machine's services without clobbering each other.
TEST_ID = env.str("CONDUCTOR_TEST_ID", default="")
_suffix = f"_{TEST_ID}" if TEST_ID else ""

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
AUDIT_HMAC_KEY = "test-audit-hmac-key-not-secret"
# A fixed Ed25519 seed (base64 of 32 bytes), not secret: tests verify with its public key.
AUDIT_SIGNING_KEY = "dGVzdC1hdWRpdC1zaWduaW5nLWtleS0zMi1ieXRlcyE="
AUDIT_LOG_NAME = "testserver/audit"
SECRETS_ENCRYPTION_KEY = "dGVzdC1mZXJuZXQta2V5LTMyLWJ5dGVzLWxvbmchISE="
WHITENOISE_AUTOREFRESH = True
RUN_SWEEP_INTERVAL_S = 3600  # tests call the sweep directly
# The test DB is flushed between tests, a published head file is not: tests that need one set it.
AUDIT_STH_PUBLISH_PATH = ""

if DATABASES["default"]["ENGINE"] == "apps.core.backends.sqlite3":
    # A file, not :memory:, so the live daphne server and the test process share one database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test{_suffix}.sqlite3")}
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_conductor{_suffix}"}

CELERY_TASK_DEFAULT_QUEUE = f"conductor{_suffix}"
if "redis" in CHANNEL_LAYERS["default"]["BACKEND"]:
    cast(dict[str, Any], CHANNEL_LAYERS["default"]["CONFIG"])["prefix"] = f"asgi{_suffix}:"

# Subprocess servers outlive each test's flush: see conductor_web.apps._disable_contenttype_cache.
CONTENTTYPE_CACHE_DISABLED = True

# Many suites share one live server and 127.0.0.1; tests of the invalid-key guard set their own limit.
APIKEY_FAILURE_LIMIT = env.int("APIKEY_FAILURE_LIMIT", default=1000)

# --- egress and provider key env (issue 13) ------------------------------------------------------
# The fake providers (tests/fakes) listen on their own loopback address; exactly that one is
# opened, so every attack spelling of 127.0.0.1 / ::1 stays refused. Subprocess servers read it too.
FAKE_PROVIDER_HOST = "127.0.13.1"
EGRESS_ALLOW = env.list("EGRESS_ALLOW", default=[FAKE_PROVIDER_HOST])
# The stdio MCP server of the tool tests (tests/fakes/mcp_server.py) runs under this interpreter.
MCP_STDIO_COMMANDS = env.list("MCP_STDIO_COMMANDS", default=[sys.executable])
