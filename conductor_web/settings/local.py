"""Embedded demo settings: nothing to configure; secrets are generated into var/."""

from .base import *  # noqa: F403
from .base import strict_bool

DEBUG = strict_bool("DEBUG", True)
