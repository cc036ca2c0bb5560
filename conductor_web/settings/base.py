"""Shared settings. Every knob comes from the one ``env`` object below (django-environ).

The embedded defaults need no configuration: SQLite in ``var/``, an in-memory channel layer and
in-process run execution. Setting ``DATABASE_URL``, ``REDIS_URL`` or ``CELERY_BROKER_URL`` switches
each part to its distributed backend independently.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import environ
from csp.constants import NONCE, NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(environ.Env().str("CONDUCTOR_VAR_DIR", default=str(BASE_DIR / "var")))
# scripts/build_local_model.sh --background holds this file while llama-cpp-python compiles.
LOCAL_MODEL_BUILD_MARKER = BASE_DIR / "var" / "local-model.building"
VAR_DIR.mkdir(parents=True, exist_ok=True)

env = environ.Env()
# A local .env is a convenience for development; real deployments set the environment.
if (BASE_DIR / ".env").is_file():
    env.read_env(str(BASE_DIR / ".env"))
# prometheus_client switches to its multiprocess files when this variable merely exists, even
# empty (as in a copied .env.example): every process then wrote gauge_*.db files into its working
# directory that nothing read (apps.insights.metrics treats empty as unset). Empty means unset.
if os.environ.get("PROMETHEUS_MULTIPROC_DIR") == "":
    del os.environ["PROMETHEUS_MULTIPROC_DIR"]


def strict_bool(name: str, default: bool) -> bool:
    """Only true/false/1/0/yes/no: a typo such as DEBUG=ture must not silently mean False."""
    raw = env.str(name, default="")
    if raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false/1/0/yes/no), got {raw!r}")


def var_secret(filename: str, *, nbytes: int = 32) -> str:
    """A secret generated once into var/ for the embedded demo (never used in production)."""
    path = VAR_DIR / filename
    if not path.exists():
        path.write_text(secrets.token_urlsafe(nbytes))
        path.chmod(0o600)
    return path.read_text().strip()


def signing_key_ok(value: str) -> bool:
    """An Ed25519 private key as AUDIT_SIGNING_KEY holds it: base64 (standard or URL-safe, padding
    optional) of 32 bytes. apps.audit.logkeys decodes it the same way."""
    text = value.strip().replace("-", "+").replace("_", "/")
    try:
        return len(base64.b64decode(text + "=" * (-len(text) % 4), validate=True)) == 32
    except (binascii.Error, ValueError):
        return False


DEBUG = strict_bool("DEBUG", False)
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="") or var_secret("secret_key", nbytes=50)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
SITE_URL = env.str("SITE_URL", default="http://127.0.0.1:8000").rstrip("/")
# Browser origins (scheme://host[:port], "*." for subdomains) that may open the run websocket
# besides the handshake's own origin (apps.core.ws_origin): scheme, host and port must match.
# Empty or unset: the origin of SITE_URL and CSRF_TRUSTED_ORIGINS.
WEBSOCKET_ALLOWED_ORIGINS = env.list("WEBSOCKET_ALLOWED_ORIGINS", default=[]) or [
    "{0.scheme}://{0.netloc}".format(urlsplit(SITE_URL)),
    *CSRF_TRUSTED_ORIGINS,
]
# An open run websocket re-checks its session and its viewer's access whenever the access version
# changed, on a session's logout at once, and at least this often while events flow (apps.runs.ws_access).
WEBSOCKET_ACCESS_RECHECK_S = env.float("WEBSOCKET_ACCESS_RECHECK_S", default=60.0)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "guardian",
    "conductor_web",
    "apps.audit",
    "apps.workers",
    "apps.governance",
    "apps.policies",
    "apps.runs",
    "apps.api",
    "apps.insights",
    "apps.learning",
    "apps.feedback",
    "apps.experiments",
    "apps.tools",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "apps.core.middleware.LoginRequiredMiddleware",
    "apps.core.middleware.RequestContextMiddleware",
]

# --- input limits (issue 14) --------------------------------------------------------------------
# Bad input gets a clear 4xx before any view, parser or database sees it (apps/core/input_limits.py).
# Bodies larger than DATA_UPLOAD_MAX_MEMORY_SIZE (bytes) are refused; on /v1/ and /api/ with a JSON 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=2_621_440)
# Largest JSON body (bytes) on /v1/, /api/ and the policy editor; most nesting levels in one.
JSON_MAX_BYTES = env.int("JSON_MAX_BYTES", default=DATA_UPLOAD_MAX_MEMORY_SIZE)
JSON_MAX_DEPTH = env.int("JSON_MAX_DEPTH", default=64)
# Right after SecurityMiddleware: before sessions, CSRF and auth read or store anything.
MIDDLEWARE.insert(1, "apps.core.input_limits.InputLimitsMiddleware")
# /v1 (issue 22): x-request-id, openai-processing-ms, x-ratelimit-* and CORS on every response,
# wrapping the input limits so their refusals carry them too.
MIDDLEWARE.insert(1, "apps.api.v1.middleware.V1Middleware")
# Browser origins allowed to call /v1 directly (CORS), e.g. https://app.example.com; "*" for any.
V1_CORS_ALLOWED_ORIGINS = env.list("V1_CORS_ALLOWED_ORIGINS", default=[])

ROOT_URLCONF = "conductor_web.urls"
ASGI_APPLICATION = "conductor_web.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "conductor_web.context_processors.navigation",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
# An empty value (as in a copied .env.example) means "not set", like every switch here.
DATABASE_URL = env.str("DATABASE_URL", default="") or f"sqlite:///{VAR_DIR / 'conductor.sqlite3'}"
DATABASES = {"default": env.db_url_config(DATABASE_URL)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web process read while the run thread writes; IMMEDIATE takes the writer lock
    # at BEGIN so two writers queue on `timeout` instead of failing with "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # Django's SQLite backend with this process's writers queued on a lock, not SQLite's sleeps.
    DATABASES["default"]["ENGINE"] = "apps.core.backends.sqlite3"
else:
    # A bounded pool per process: a burst of requests waits for a connection (up to
    # DB_POOL_TIMEOUT s, then a truthful 503) instead of each request thread opening its own and
    # exhausting the server's max_connections (128 /v1 clients on one daphne failed every run with
    # "too many clients"). DB_POOL_MAX_SIZE=0 turns the pool off (then DB_CONN_MAX_AGE applies).
    DB_POOL_MAX_SIZE = env.int("DB_POOL_MAX_SIZE", default=20)
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Django's backend but for how a pooled connection is checked (see below).
        DATABASES["default"]["ENGINE"] = "apps.core.backends.postgresql"
        # The statements apps.core.compiled sends on every run are prepared once per
        # connection (parsed and planned once, not on each call: a third of PostgreSQL's CPU at
        # load, issue #15). Django's default (None) turns psycopg's preparing off; Django's own
        # queries bind on the client and are never prepared either way. Behind PgBouncer in
        # transaction mode before 1.21 (no prepared statements), set DB_PREPARED_STATEMENTS=false.
        if env.bool("DB_PREPARED_STATEMENTS", default=True):
            DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5
    if DB_POOL_MAX_SIZE > 0:
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django's pool requires it
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(2, DB_POOL_MAX_SIZE),
            "max_size": DB_POOL_MAX_SIZE,
            "timeout": env.float("DB_POOL_TIMEOUT", default=10.0),
        }
        # A checked-out connection is tested first, so a restarted PostgreSQL costs a reconnect,
        # not a failed request: by a look at its socket, and by a round trip only when that shows
        # anything (apps.core.backends.postgresql). Django's check would be a round trip on
        # every checkout.
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    else:
        DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=0))
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channel layer -----------------------------------------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")
# A process's one run fan-out channel (apps.runs.fanout) carries every run its viewers watch.
_FANOUT_CAPACITY = {"runs-fanout.*": 20_000}
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [REDIS_URL],
                "capacity": 1500,
                "expiry": 60,
                "channel_capacity": _FANOUT_CAPACITY,
            },
        }
    }
else:
    # InMemoryChannelLayer does not compile channel_capacity globs (Channels 4.3): one capacity
    # for all, the fan-out's included.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": _FANOUT_CAPACITY["runs-fanout.*"]},
        }
    }

# --- Execution ---------------------------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="")
EXECUTION_BACKEND = "celery" if CELERY_BROKER_URL else "thread"
RUN_THREAD_WORKERS = env.int("RUN_THREAD_WORKERS", default=4)
# Which plain (non-streaming) /v1 runs execute on the request's own thread right after they are
# accepted, instead of being handed to the thread pool or Celery and waited for (issue #15: no
# dispatch, no wake-up, no status polls). "passthrough": one-worker pool models (a gateway's work);
# "all": every plain /v1 run; "off". Distributed mode defaults to "off": its runs execute on the
# Celery workers, which may be the only hosts allowed to reach the providers.
V1_INLINE_RUNS = env.str("V1_INLINE_RUNS", default="") or (
    "off" if EXECUTION_BACKEND == "celery" else "passthrough"
)
if V1_INLINE_RUNS not in ("off", "passthrough", "all"):
    raise ImproperlyConfigured(f"V1_INLINE_RUNS must be off, passthrough or all, got {V1_INLINE_RUNS!r}")
# At most this many runs execute inline at once per process; a request that finds none free within
# V1_INLINE_WAIT_S is queued as usual.
V1_INLINE_SLOTS = env.int("V1_INLINE_SLOTS", default=RUN_THREAD_WORKERS)
V1_INLINE_WAIT_S = env.float("V1_INLINE_WAIT_S", default=5.0)
# Whether a /v1 run's model calls stream from the provider: "client" (the default) streams only
# when the client asked for a stream; a plain request's calls are plain, as a gateway makes them
# (no per-token parsing, no step.delta events: its viewers see each step's output when it ends).
# "always" streams every call, so a plain request's run graph also fills token by token.
V1_UPSTREAM_STREAM = env.str("V1_UPSTREAM_STREAM", default="client")
if V1_UPSTREAM_STREAM not in ("client", "always"):
    raise ImproperlyConfigured(f"V1_UPSTREAM_STREAM must be client or always, got {V1_UPSTREAM_STREAM!r}")
# Daphne processes `python -m conductor_web.serve` starts on one address (SO_REUSEPORT): one
# process runs Python on one core at a time, so served runs scale with processes (bench/API.md).
# They share only the database and the channel layer: more than one needs PostgreSQL and Redis.
WEB_PROCESSES = env.int("WEB_PROCESSES", default=1)
# The ASGI server of `make demo` and `python -m conductor_web.serve`: daphne (Twisted; the default)
# or uvicorn (uvloop and httptools; less CPU per /v1 request, see bench/GATEWAY.md). Both serve
# the pages, /v1 and the run websockets.
WEB_SERVERS = ("daphne", "uvicorn")
WEB_SERVER = env.str("WEB_SERVER", default="daphne")
if WEB_SERVER not in WEB_SERVERS:
    raise ImproperlyConfigured(f"WEB_SERVER must be one of {', '.join(WEB_SERVERS)}, got {WEB_SERVER!r}")
if WEB_PROCESSES < 1:
    raise ImproperlyConfigured(f"WEB_PROCESSES must be at least 1, got {WEB_PROCESSES}")
if WEB_PROCESSES > 1 and (not REDIS_URL or DATABASES["default"]["ENGINE"].endswith("sqlite3")):
    raise ImproperlyConfigured(
        f"WEB_PROCESSES={WEB_PROCESSES} needs DATABASE_URL=postgres://… and REDIS_URL: the embedded "
        "SQLite queues its writers within one process, and a viewer on the in-memory channel layer "
        "sees only the runs of its own process"
    )
RUN_TIMEOUT_S = env.int("RUN_TIMEOUT_S", default=600)
# Per-worker circuit breaker from traffic (issue 44, docs/operations.md "Circuit breaker").
CIRCUIT_FAILURES = env.int("CIRCUIT_FAILURES", default=5)  # consecutive down-failures that open it
CIRCUIT_ERROR_RATE = env.float("CIRCUIT_ERROR_RATE", default=0.5)  # ...or this share of the window
CIRCUIT_WINDOW = env.int("CIRCUIT_WINDOW", default=20)  # recent calls the error rate is taken over
CIRCUIT_COOLDOWN_S = env.float("CIRCUIT_COOLDOWN_S", default=30.0)  # open, then one probe
# A run still `running` this long after its deadline is swept to `timed_out` (dead worker).
RUN_SWEEP_GRACE_S = env.int("RUN_SWEEP_GRACE_S", default=60)
RUN_SWEEP_INTERVAL_S = env.int("RUN_SWEEP_INTERVAL_S", default=30)

CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SOFT_TIME_LIMIT = env.int("CELERY_TASK_SOFT_TIME_LIMIT", default=RUN_TIMEOUT_S)
CELERY_TASK_TIME_LIMIT = env.int("CELERY_TASK_TIME_LIMIT", default=RUN_TIMEOUT_S + 60)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = False
AUDIT_RETENTION_INTERVAL_S = env.int("AUDIT_RETENTION_INTERVAL_S", default=3600)
AUDIT_VERIFY_INTERVAL_S = env.int("AUDIT_VERIFY_INTERVAL_S", default=86400)
CELERY_BEAT_SCHEDULE = {
    "sweep-stale-runs": {"task": "apps.runs.tasks.sweep_stale_runs", "schedule": float(RUN_SWEEP_INTERVAL_S)},
    "audit-retention-sweep": {
        "task": "apps.runs.tasks.retention_sweep",
        "schedule": float(AUDIT_RETENTION_INTERVAL_S),
    },
    "audit-verify": {"task": "apps.audit.tasks.audit_verify", "schedule": float(AUDIT_VERIFY_INTERVAL_S)},
}

# --- Audit sequencer and signed tree heads (apps.audit.sequencer) ------------------------------
# Signed tree heads are appended as JSON lines here on a timer (embedded thread / beat); point it
# at write-once storage (append-only mount, `chattr +a`, object-lock sync). Empty: do not publish.
AUDIT_STH_PUBLISH_PATH = env.str("AUDIT_STH_PUBLISH_PATH", default=str(VAR_DIR / "audit-sth.jsonl"))
AUDIT_STH_INTERVAL_S = env.int("AUDIT_STH_INTERVAL_S", default=60)
AUDIT_SEQUENCER_POLL_MS = env.int("AUDIT_SEQUENCER_POLL_MS", default=200)
AUDIT_SEQUENCER_WINDOW_MS = env.int("AUDIT_SEQUENCER_WINDOW_MS", default=5)
# Under load, passes start at least this far apart (each sequences everything committed since).
AUDIT_SEQUENCER_MIN_GAP_MS = env.int("AUDIT_SEQUENCER_MIN_GAP_MS", default=50)
# Distributed mode: web processes sequence only when a row has waited this long (the Celery
# workers' sequencers are the active ones); 0 makes them active sequencers too.
AUDIT_SEQUENCER_STANDBY_S = env.float("AUDIT_SEQUENCER_STANDBY_S", default=1.0)
# The log's name: its checkpoints' origin is "<name>/<random id>", the id created with the log.
AUDIT_LOG_NAME = env.str("AUDIT_LOG_NAME", default="") or (
    SITE_URL.split("://", 1)[-1].split("/", 1)[0] + "/audit"
)
# Witnesses cosigning checkpoints (c2sp.org/tlog-witness), comma-separated "<vkey> <url>" entries:
# the witness's cosigner key (type 0x04) and its submission prefix (POST <url>/add-checkpoint).
AUDIT_WITNESSES = env.list("AUDIT_WITNESSES", default=[])
AUDIT_WITNESS_TIMEOUT_S = env.float("AUDIT_WITNESS_TIMEOUT_S", default=5.0)
CELERY_BEAT_SCHEDULE["audit-sth-publish"] = {
    "task": "apps.audit.tasks.audit_sth_publish",
    "schedule": float(AUDIT_STH_INTERVAL_S),
}

# --- run leases and outbox (issue 14) -----------------------------------------------------------
# A running run is owned by one executor through a lease it renews every RUN_LEASE_S/3 s; when the
# lease expires (or its owner is a dead process on this host) the run is re-queued, at most
# RUN_MAX_ATTEMPTS claims in all, then it ends `failed`. Every server and Celery worker reaps lost
# runs and drains the dispatch outbox (runs accepted while the broker was down) each interval.
RUN_LEASE_S = env.float("RUN_LEASE_S", default=10.0)
RUN_REAP_INTERVAL_S = env.float("RUN_REAP_INTERVAL_S", default=2.0)
RUN_MAX_ATTEMPTS = env.int("RUN_MAX_ATTEMPTS", default=3)
# A fresh outbox row is its creator's to hand off (on commit); other processes' drains take
# it only after this long (a creator that died between commit and hand-off).
RUN_DISPATCH_GRACE_S = env.float("RUN_DISPATCH_GRACE_S", default=5.0)
RUN_EXECUTOR_NODE = env.str("RUN_EXECUTOR_NODE", default="")  # default: the host name
CELERY_RUN_QUEUE = env.str("CELERY_RUN_QUEUE", default="")  # default: CELERY_TASK_DEFAULT_QUEUE
# Fail a publish fast when the broker is down: the outbox keeps the run, the request returns.
CELERY_BROKER_CONNECTION_TIMEOUT = env.float("CELERY_BROKER_CONNECTION_TIMEOUT", default=2.0)
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
if CELERY_BROKER_URL.startswith(("amqp", "pyamqp")):
    # Publisher confirms: a publish on a connection the broker already lost raises instead of
    # vanishing into a socket buffer, so the outbox keeps the run.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
CELERY_BEAT_SCHEDULE["reap-runs"] = {"task": "apps.runs.tasks.reap_runs", "schedule": RUN_REAP_INTERVAL_S * 5}

# --- Secrets -----------------------------------------------------------------------------------
AUDIT_HMAC_KEY = env.str("AUDIT_HMAC_KEY", default="") or var_secret("audit_hmac.key")
# Ed25519 key signing the audit log's checkpoints (base64 of a 32-byte seed; apps.audit.logkeys).
# Verifiers need only its public key (manage.py audit_keys). Embedded: var/audit_signing.key.
AUDIT_SIGNING_KEY = env.str("AUDIT_SIGNING_KEY", default="") or var_secret("audit_signing.key", nbytes=32)
# Public keys (base64, 32 bytes) of earlier signing keys: their checkpoints stay verifiable.
AUDIT_SIGNING_KEYS_RETIRED = env.list("AUDIT_SIGNING_KEYS_RETIRED", default=[])
# Fernet key for provider credentials stored in the database (urlsafe base64, 32 bytes).
SECRETS_ENCRYPTION_KEY = env.str("SECRETS_ENCRYPTION_KEY", default="")
if not SECRETS_ENCRYPTION_KEY:
    import base64

    _raw = var_secret("fernet.key")
    SECRETS_ENCRYPTION_KEY = base64.urlsafe_b64encode(_raw.encode()[:32].ljust(32, b"0")).decode()
DEMO_PASSWORD = env.str("DEMO_PASSWORD", default="")
AUDIT_REVIEW_SAMPLE_RATE = env.float("AUDIT_REVIEW_SAMPLE_RATE", default=0.0)
# E-mail the team's reviewers (Django's mail backend) when a run enters the review queue.
REVIEW_NOTIFY_EMAIL = strict_bool("REVIEW_NOTIFY_EMAIL", False)
USE_X_FORWARDED_FOR = strict_bool("USE_X_FORWARDED_FOR", False)

# --- egress and provider key env (issue 13) ------------------------------------------------------
# Where provider clients may connect besides public addresses: comma list of CIDRs, addresses and
# host names, each optionally with :port or :low-high (IPv6 in brackets). See docs/security.md.
EGRESS_ALLOW = env.list("EGRESS_ALLOW", default=[])
# Environment variables a provider may name as its key source (platform administrators only).
PROVIDER_KEY_ENV_PREFIX = env.str("PROVIDER_KEY_ENV_PREFIX", default="CONDUCTOR_PROVIDER_KEY_")
PROVIDER_KEY_ENV_ALLOWED = env.list(
    "PROVIDER_KEY_ENV_ALLOWED", default=["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"]
)

# --- governed tools (issue 43) -------------------------------------------------------------------
# Executables a stdio MCP server may start (absolute paths; comma list). Empty: no stdio servers.
# Registering one is a platform decision (superusers only): it runs a command on this host.
MCP_STDIO_COMMANDS = env.list("MCP_STDIO_COMMANDS", default=[])
# Seconds one discovery or tool call may take before it is abandoned.
MCP_CALL_TIMEOUT_S = env.float("MCP_CALL_TIMEOUT_S", default=30.0)

# --- Auth ----------------------------------------------------------------------------------------
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user object; anonymous sees nothing
GUARDIAN_RAISE_403 = True
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

# --- I18N / static --------------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise warns at every start when it is missing
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # plotly.js comes from the plotly Python package's bundled copy: no CDN anywhere.
    "apps.core.staticfiles.PlotlyFinder",
]
# Serve straight from the finders so the embedded mode needs no collectstatic step.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- REST framework -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.api.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # input limits (issue 14): JSON bodies through the size/depth/character-checked loader.
    "DEFAULT_PARSER_CLASSES": [
        "apps.core.input_limits.SafeJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Conductor Web API",
    "DESCRIPTION": "REST API of Conductor Web: pools, policies, runs, audit trail, teams and API keys.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # /v1 are plain protocol views: their paths and schemas are added by a hook (apps.api.schema).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "apps.api.schema.add_v1_paths",
    ],
}

# --- Logging --------------------------------------------------------------------------------------
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "redact_secrets": {"()": "apps.core.logging.RedactSecretsFilter"},
        "request_id": {"()": "apps.core.logging.RequestIdFilter"},
    },
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s%(request_id)s %(message)s"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["redact_secrets", "request_id"],
        },
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
    },
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

# --- web hardening (issue 13) -----------------------------------------------------------------
# Login throttling (django-axes): failures are counted in the database per username + client IP,
# so the lock holds with Redis down. conductor_web.auth audits every failure and lockout.
INSTALLED_APPS += ["axes", "csp"]
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1, "csp.middleware.CSPMiddleware"
)
MIDDLEWARE.append("axes.middleware.AxesMiddleware")  # last, as axes requires
AUTHENTICATION_BACKENDS.insert(0, "conductor_web.auth.LockoutBackend")
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("AXES_COOLOFF_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# Refused attempts during a lockout must not extend it (else anyone can keep a user locked out).
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "apps.core.middleware.client_ip"  # honours USE_X_FORWARDED_FOR
AXES_LOCKOUT_CALLABLE = "conductor_web.auth.lockout_response"
AXES_DISABLE_ACCESS_LOG = True  # successes are in the session table; failures in the audit trail
AXES_VERBOSE = False
# Invalid API keys per client IP (apps.api.keyguard, in-process memory: no Redis needed).
APIKEY_FAILURE_LIMIT = env.int("APIKEY_FAILURE_LIMIT", default=10)
APIKEY_FAILURE_WINDOW_S = env.int("APIKEY_FAILURE_WINDOW_S", default=60)
APIKEY_COOLOFF_S = env.int("APIKEY_COOLOFF_S", default=300)
# Content-Security-Policy (django-csp 4): scripts only from here and with the per-request nonce
# (templates write nonce="{{ request.csp_nonce }}" on inline scripts). Styles allow inline: the
# templates and plotly set style attributes.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:", "blob:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "worker-src": [SELF, "blob:"],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}
# The OpenAPI schema and its docs pages: a session or an API key, like the API itself.
SPECTACULAR_SETTINGS["SERVE_PERMISSIONS"] = ["rest_framework.permissions.IsAuthenticated"]
LOGGING["loggers"]["axes"] = {"level": "WARNING"}  # type: ignore[index]
