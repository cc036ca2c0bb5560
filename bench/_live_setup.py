"""Shared set-up of the benchmarks that start a live product (api_overhead.py, gateway.py).

Call ``prepare(...)`` before ``django.setup()``: it writes a settings module for the bench's own
processes (daphne, Celery) and gives them a fresh database: a new SQLite file in the embedded
mode; in the distributed mode the PostgreSQL database DATABASE_URL names is dropped and recreated
(its name must end in ``_bench``, so a real database is never touched).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]


def prepare(*, mode: str, work: Path, name: str, sqlite_file: Path, extra_settings: str = "") -> None:
    work.mkdir(exist_ok=True)
    (work / f"{name}_settings.py").write_text(
        "from conductor_web.settings.local import *  # noqa\n"
        "DEBUG = False\n"
        f"CELERY_TASK_DEFAULT_QUEUE = '{name}'\n"
        "LOGGING['root']['level'] = 'WARNING'\n" + extra_settings
    )
    sys.path.insert(0, str(work))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(work), str(ROOT), os.environ.get("PYTHONPATH", "")])
    os.environ["DJANGO_SETTINGS_MODULE"] = f"{name}_settings"
    # The fake provider listens on its own loopback address (tests/fakes); egress to it is
    # opened, like the test settings do, and to nothing else.
    os.environ.setdefault("EGRESS_ALLOW", "127.0.13.1")
    if mode == "embedded":
        for var in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"):
            os.environ.pop(var, None)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{sqlite_file}{suffix}").unlink(missing_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{sqlite_file}"
        return
    missing = [v for v in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL") if not os.environ.get(v)]
    if missing:
        sys.exit(f"--mode distributed needs {', '.join(missing)}")
    import psycopg

    url = urlparse(os.environ["DATABASE_URL"])
    db = url.path.lstrip("/")
    if not db.endswith("_bench"):
        sys.exit("use a database whose name ends with _bench: it is dropped and recreated")
    with psycopg.connect(url._replace(path="/postgres").geturl(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db}"')
