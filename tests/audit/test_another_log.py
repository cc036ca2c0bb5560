"""Issue 40, item 1: no false tamper alarms. Published heads of another database (a demo reset,
the same checkout pointed at PostgreSQL) are another log's, named as such with their file; a
broken verdict names the head and its source; the UI and the CLI give one verdict in one text.

Only interfaces that existed before issue 40 are used here (the Celery task that publishes heads,
flush, ``audit_verify``, "Verify now"), so the reproductions also run, and fail, on that code.
"""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from apps.audit.models import AuditChainHead, SignedTreeHead
from apps.audit.tasks import audit_sth_publish
from apps.governance.models import Role
from tests.factories.audit import append_events
from tests.factories.governance import TeamFactory, member_of


def cli_verify() -> tuple[int, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("audit_verify", stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), (out.getvalue() + err.getvalue()).strip()
    return 0, (out.getvalue() + err.getvalue()).strip()


def ui_verify(client: Client) -> str:
    response = client.post("/audit/verify/", follow=True)
    assert response.status_code == 200
    (message,) = [str(m) for m in response.context["messages"]]
    return message


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_a_fresh_database_on_a_checkout_with_another_databases_heads_verifies_intact(
    settings: Any, tmp_path: Path
) -> None:
    """`make clean && make demo`, or the same checkout pointed at PostgreSQL: the published
    heads of the old database stay in var/. They belong to another log; the verdict says so and
    names the file, and the UI and the CLI say the same thing."""
    published = tmp_path / "audit-sth.jsonl"
    settings.AUDIT_STH_PUBLISH_PATH = str(published)
    append_events(12)
    audit_sth_publish()  # the timer's task: signs the head, appends it to the file
    assert published.read_text().count("\n") == 1
    call_command("flush", interactive=False, verbosity=0)  # another database: a fresh log
    reviewer = member_of(TeamFactory(slug="fresh"), Role.REVIEWER)
    append_events(3)
    head = AuditChainHead.objects.get(pk=1).seq
    client = Client()
    client.force_login(reviewer)

    code, cli = cli_verify()
    ui = ui_verify(client)
    assert code == 0, cli
    assert cli.startswith("OK audit chain intact: ")
    assert re.sub(r" \(\d+\.\d+s\)$", "", cli.removeprefix("OK ")) == ui  # one verdict, one text
    assert f"audit chain intact: {head} events verified up to seq {head}" in ui
    assert "not checked: another log (testserver/audit/" in ui and f"1 head in {published}" in ui
    assert f"no published checkpoint of this log in {published}" in ui
    assert re.search(r"; log testserver/audit/[0-9a-f]{16}; ", ui)
    assert AuditChainHead.objects.get(pk=1).last_verify_message == ui  # what the audit page shows


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_a_broken_verdict_names_the_head_and_its_source_in_the_ui_and_the_cli(
    settings: Any, tmp_path: Path, tamper: Any, reviewer: Any
) -> None:
    published = tmp_path / "audit-sth.jsonl"
    settings.AUDIT_STH_PUBLISH_PATH = str(published)
    events = append_events(8)
    size = audit_sth_publish()
    SignedTreeHead.objects.all().delete()  # the attacker's database no longer has its heads...
    tamper.delete(events[-1].seq)  # ... and the newest event is gone, the head rolled back
    AuditChainHead.objects.filter(pk=1).update(seq=events[-2].seq, digest=events[-2].digest)
    client = Client()
    client.force_login(reviewer)
    code, cli = cli_verify()
    ui = ui_verify(client)
    assert code == 1
    assert f"published checkpoint ({published}, line 1) covers {size} events: its tail was deleted" in ui
    assert cli.startswith(f"BROKEN seq={size} reason=deleted: ")
    assert ui.startswith(f"audit chain BROKEN at seq {size}: deleted — ")
    assert cli.split(": ", 1)[1] in ui  # the same message and the same sources
