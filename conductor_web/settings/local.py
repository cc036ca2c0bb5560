"""Embedded demo settings: nothing to configure; secrets are generated into var/."""

from .base import *  # noqa: F403
from .base import strict_bool

# Off by default: the demo is reachable by others and must never show a debug page (tracebacks,
# settings). DEBUG=true opts in while developing; whitenoise serves static files either way.
DEBUG = strict_bool("DEBUG", False)
