"""Local fixture glue for the api tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures.core import ROOT, LiveServer, _stop, _wait_for_port, free_port, subprocess_env


@pytest.fixture
def fake_openai(openai_fake: Any) -> Any:
    # tests/fixtures/workers.py's fake_pool asks for ``fake_openai``; the fakes module provides
    # ``openai_fake``. Bridge the two names here until the shared fixtures agree.
    return openai_fake


@pytest.fixture
def api_server(transactional_db: Any, tmp_path: Any) -> Iterator[LiveServer]:
    """A daphne process started for this test.

    Why not the session-wide ``daphne_server``: every transactional test's flush re-creates the
    content types and permissions with *new* ids, and a long-lived server keeps the old ids in
    ``ContentType.objects``' cache, so guardian answers "no permission" from the second test on.
    A fresh process per test sees the current ids.
    """
    port = free_port()
    log = tmp_path / "daphne.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "conductor_web.asgi:application",
            ],
            cwd=ROOT,
            env=subprocess_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for_port(port, proc, 60, log)
        yield LiveServer(f"http://127.0.0.1:{port}", proc, log)
    finally:
        _stop(proc)
