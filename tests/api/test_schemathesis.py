"""schemathesis against ``/api/schema/`` on a live server: no 5xx, responses match the schema.

Runs the ``st`` CLI (bounded examples, fixed seed) with an admin API key of alpha, so every
operation is reachable and exercised with generated valid and invalid input.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.factories.api import make_api_key

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

ST = str(Path(sys.executable).with_name("st"))


def test_schema_is_served_and_valid(api_server: Any, alpha: Any, team_admin: Any) -> None:
    import httpx

    # The schema and docs need a session or a key (issue 13).
    auth = {"Authorization": f"Bearer {make_api_key(alpha, principal=team_admin).plaintext}"}
    assert httpx.get(f"{api_server.url}/api/schema/", timeout=30).status_code == 401
    schema = httpx.get(
        f"{api_server.url}/api/schema/", headers={"Accept": "application/json", **auth}, timeout=30
    ).json()
    assert schema["openapi"].startswith("3.")
    paths = set(schema["paths"])
    for expected in (
        "/api/runs/",
        "/api/runs/{run_id}/steps/",
        "/api/audit/events/",
        "/api/pools/",
        "/api/policies/{policy_id}/diff/",
        "/api/teams/{slug}/keys/",
    ):
        assert expected in paths
    assert "apiKey" in schema["components"]["securitySchemes"]
    docs = httpx.get(f"{api_server.url}/api/docs/", headers=auth, timeout=30)
    assert docs.status_code == 200
    # The interactive docs load their assets from this server (drf-spectacular-sidecar), no CDN.
    assert "cdn." not in docs.text and "/static/drf_spectacular_sidecar/" in docs.text
    asset = docs.text.split("/static/drf_spectacular_sidecar/", 1)[1].split('"', 1)[0]
    assert (
        httpx.get(f"{api_server.url}/static/drf_spectacular_sidecar/{asset}", timeout=30).status_code == 200
    )


# Every operation of the schema with bounded examples: about 100 s on an idle machine, several
# minutes when the phases run side by side or the machine is shared, more than the suite's default
# 300 s. The st subprocess has the same bound, so a hang still ends with its output.
@pytest.mark.timeout(900)
def test_schemathesis_finds_no_server_errors_and_no_schema_violations(
    api_server: Any,
    runtime_workers: Any,
    fake_pool: Any,
    alpha: Any,
    team_admin: Any,
    owner: Any,
    tmp_path: Path,
) -> None:
    key = make_api_key(
        alpha,
        name="schemathesis",
        role="admin",
        principal=team_admin,
        requests_per_minute=100_000,
        tokens_per_minute=100_000_000,
    ).plaintext
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL"))}
    result = subprocess.run(
        [
            ST,
            "run",
            f"{api_server.url}/api/schema/",
            "--checks",
            "not_a_server_error,response_schema_conformance",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "5",
            "--seed",
            "20261122",
            "--generation-database",
            "none",
            "--request-timeout",
            "30",
            "--workers",
            "1",
            "--no-color",
            "-H",
            f"Authorization: Bearer {key}",
            # Revoking generated key ids could revoke the key under test mid-run.
            # /v1 (in the schema for the docs) starts real runs; the SDK tests (tests/compat) cover it.
            "--exclude-path-regex",
            r"/revoke/$|^/v1/",
        ],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=tmp_path,
        env=env,
    )
    output = result.stdout + result.stderr
    if os.environ.get("ST_DUMP"):  # for a human debugging a failure: kept in the test's tmp dir
        (tmp_path / "st_out.txt").write_text(output)
    assert result.returncode == 0, output[-6000:]
    assert "No issues found" in output or "passed" in output.lower(), output[-3000:]
