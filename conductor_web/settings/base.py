"""Shared settings. Every knob comes from the one ``env`` object below (django-environ).

The embedded defaults need no configuration: SQLite in ``var/``, an in-memory channel layer and
in-process run execution. Setting ``DATABASE_URL``, ``REDIS_URL`` or ``CELERY_BROKER_URL`` switches
each part to its distributed backend independently.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(environ.Env().str("CONDUCTOR_VAR_DIR", default=str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

env = environ.Env()
# A local .env is a convenience for development; real deployments set the environment.
if (BASE_DIR / ".env").is_file():
    env.read_env(str(BASE_DIR / ".env"))


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


DEBUG = strict_bool("DEBUG", False)
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="") or var_secret("secret_key", nbytes=50)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
SITE_URL = env.str("SITE_URL", default="http://127.0.0.1:8000").rstrip("/")

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
    "conductor_web.middleware.LoginRequiredMiddleware",
    "conductor_web.middleware.RequestContextMiddleware",
]

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
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("DB_CONN_MAX_AGE", default=0))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channel layer -----------------------------------------------------------------------------
REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 1500, "expiry": 60},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Execution ---------------------------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="")
EXECUTION_BACKEND = "celery" if CELERY_BROKER_URL else "thread"
RUN_THREAD_WORKERS = env.int("RUN_THREAD_WORKERS", default=4)
RUN_TIMEOUT_S = env.int("RUN_TIMEOUT_S", default=600)
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
        "task": "apps.audit.tasks.audit_retention_sweep",
        "schedule": float(AUDIT_RETENTION_INTERVAL_S),
    },
    "audit-verify": {"task": "apps.audit.tasks.audit_verify", "schedule": float(AUDIT_VERIFY_INTERVAL_S)},
}

# --- Secrets -----------------------------------------------------------------------------------
AUDIT_HMAC_KEY = env.str("AUDIT_HMAC_KEY", default="") or var_secret("audit_hmac.key")
# Fernet key for provider credentials stored in the database (urlsafe base64, 32 bytes).
SECRETS_ENCRYPTION_KEY = env.str("SECRETS_ENCRYPTION_KEY", default="")
if not SECRETS_ENCRYPTION_KEY:
    import base64

    _raw = var_secret("fernet.key")
    SECRETS_ENCRYPTION_KEY = base64.urlsafe_b64encode(_raw.encode()[:32].ljust(32, b"0")).decode()
DEMO_PASSWORD = env.str("DEMO_PASSWORD", default="")
AUDIT_REVIEW_SAMPLE_RATE = env.float("AUDIT_REVIEW_SAMPLE_RATE", default=0.0)
USE_X_FORWARDED_FOR = strict_bool("USE_X_FORWARDED_FOR", False)

# --- Auth ----------------------------------------------------------------------------------------
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user object; anonymous sees nothing
GUARDIAN_RAISE_403 = True
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "playground"
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
    "conductor_web.staticfiles.PlotlyFinder",
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
}

# --- Logging --------------------------------------------------------------------------------------
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact_secrets": {"()": "conductor_web.logging.RedactSecretsFilter"}},
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact_secrets"]},
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
