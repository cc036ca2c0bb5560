"""Production settings: refuse to start with missing secrets or DEBUG on."""

from django.core.exceptions import ImproperlyConfigured

from .base import *  # noqa: F403
from .base import env, signing_key_ok, strict_bool

DEBUG = strict_bool("DEBUG", False)
if DEBUG:
    raise ImproperlyConfigured("DEBUG must be off in production (unset DEBUG or set DEBUG=false).")

# No defaults: a missing secret must stop the process, not fall back to a generated one.
for _name in ("DJANGO_SECRET_KEY", "AUDIT_HMAC_KEY", "AUDIT_SIGNING_KEY", "SECRETS_ENCRYPTION_KEY"):
    if not env.str(_name, default=""):
        raise ImproperlyConfigured(f"{_name} is required in production.")
SECRET_KEY = env.str("DJANGO_SECRET_KEY")
AUDIT_HMAC_KEY = env.str("AUDIT_HMAC_KEY")
AUDIT_SIGNING_KEY = env.str("AUDIT_SIGNING_KEY")
if not signing_key_ok(AUDIT_SIGNING_KEY):
    raise ImproperlyConfigured(
        "AUDIT_SIGNING_KEY must be the base64 of a 32-byte Ed25519 private key "
        "(generate one with: manage.py audit_keys --generate)."
    )
SECRETS_ENCRYPTION_KEY = env.str("SECRETS_ENCRYPTION_KEY")

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS")
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = strict_bool("SESSION_COOKIE_SECURE", True)
CSRF_COOKIE_SECURE = strict_bool("CSRF_COOKIE_SECURE", True)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
WHITENOISE_USE_FINDERS = False
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
