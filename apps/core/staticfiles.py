"""A staticfiles finder serving plotly.js from the installed ``plotly`` package (no CDN)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_STATIC_NAME = "vendor/plotly.min.js"
_PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


class PlotlyFinder(BaseFinder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=str(_PLOTLY_JS.parent))
        self.storage.prefix = "vendor"  # type: ignore[attr-defined]

    def check(self, **kwargs: Any) -> list[Any]:
        return []

    # The stubs' overloads omit the deprecated ``all=`` keyword this still honours.
    def find(  # type: ignore[override]
        self, path: str, find_all: bool = False, **kwargs: Any
    ) -> str | list[str]:
        if path == PLOTLY_STATIC_NAME and _PLOTLY_JS.is_file():
            return [str(_PLOTLY_JS)] if find_all or kwargs.get("all") else str(_PLOTLY_JS)
        return [] if find_all or kwargs.get("all") else ""

    def list(self, ignore_patterns: Any) -> Iterator[tuple[str, FileSystemStorage]]:
        if _PLOTLY_JS.is_file():
            yield os.path.basename(_PLOTLY_JS), self.storage
