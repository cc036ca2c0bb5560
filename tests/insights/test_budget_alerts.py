"""Budget alerts: 50 / 80 / 100 % of a team budget → one notice per team admin and a signed
webhook with retries, logged and audited. The observer is called as the run sink calls it after a
run finishes; the webhook goes to a real HTTP receiver on loopback."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from apps.audit.models import AuditEvent
from apps.insights import services
from apps.insights.models import BudgetAlert, BudgetNotice, WebhookDelivery
from apps.runs.observers import RunEventView
from tests.factories.policies import publish_policy
from tests.factories.runs import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "budget-webhook-secret-for-tests"


class Receiver:
    """Answers ``fail_first`` requests with 500, then 200; records (headers, body)."""

    def __init__(self, fail_first: int) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.changed:
                    receiver.requests.append((dict(self.headers), body))
                    failing = len(receiver.requests) <= fail_first
                    receiver.changed.notify_all()
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, n: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.requests) >= n, timeout=30), self.requests


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first=2)
    yield r
    r.server.shutdown()
    r.server.server_close()


def _finished(run: Any) -> RunEventView:
    return RunEventView(run.id, run.team_id, None, {"type": "run.finished", "seq": 9, "ts": 0.0, "data": {}})


def _wait_delivery(alert: BudgetAlert) -> WebhookDelivery:
    done = threading.Event()
    for _ in range(600):  # poll the delivery log the worker thread writes
        delivery = WebhookDelivery.objects.get(alert=alert)
        if delivery.status != "pending":
            return delivery
        done.wait(0.05)
    raise AssertionError("webhook delivery never finished")


def test_thresholds_notify_admins_once_and_sign_the_webhook(
    settings: Any, receiver: Receiver, alpha: Any, fake_pool: Any, owner: Any, team_admin: Any
) -> None:
    settings.BUDGET_ALERT_WEBHOOK_URL = receiver.url
    settings.BUDGET_ALERT_WEBHOOK_SECRET = SECRET
    settings.BUDGET_ALERT_WEBHOOK_BACKOFF_S = 0.05
    publish_policy(alpha, {"budgets": {"daily": {"hard_usd": "1"}}})

    run = RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, cost_usd=Decimal("0.40"))
    services.on_run_event(_finished(run))
    assert not BudgetAlert.objects.exists()  # 40 %: nothing yet

    run = RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, cost_usd=Decimal("0.45"))
    services.on_run_event(_finished(run))  # 85 %: 50 and 80 at once
    services.on_run_event(_finished(run))  # the same run again (a retry): nothing new
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [50, 80]

    admins = set(services.team_admins(alpha))
    assert team_admin in admins and owner not in admins
    notices = BudgetNotice.objects.filter(alert__threshold=80)
    assert {n.user for n in notices} == admins

    alert = BudgetAlert.objects.get(threshold=80)
    receiver.wait_for(4)  # two alerts, the first two posts (whichever alert) fail and are retried
    delivery = _wait_delivery(alert)
    other = _wait_delivery(BudgetAlert.objects.get(threshold=50))
    assert {delivery.status, other.status} == {"delivered"}
    assert delivery.attempts + other.attempts == 4  # only the first two posts failed
    for headers, body in receiver.requests:
        expected = services.sign(SECRET, headers["X-Conductor-Timestamp"], body)
        assert headers["X-Conductor-Signature"] == expected
        assert json.loads(body)["team"] == "alpha"
    thresholds = sorted({json.loads(b)["threshold_percent"] for _, b in receiver.requests})
    assert thresholds == [50, 80]

    raised = AuditEvent.objects.filter(event_type="budget.alert_raised", team=alpha)
    assert sorted(e.payload["threshold"] for e in raised) == [50, 80]
    delivered = AuditEvent.objects.filter(event_type="budget.alert_delivered", team=alpha)
    assert sorted(e.payload["status"] for e in delivered) == ["delivered", "delivered"]

    RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, cost_usd=Decimal("0.20"))
    services.on_run_event(_finished(run))  # 105 %
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [50, 80, 100]


def test_without_a_webhook_only_notices_and_a_dead_endpoint_is_logged_failed(
    settings: Any, alpha: Any, fake_pool: Any, owner: Any, team_admin: Any
) -> None:
    from tests.fixtures.core import free_port

    publish_policy(alpha, {"budgets": {"monthly": {"soft_usd": "1"}}})
    run = RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, cost_usd=Decimal("0.5"))
    services.on_run_event(_finished(run))
    (alert,) = BudgetAlert.objects.all()
    assert alert.threshold == 50 and not WebhookDelivery.objects.exists()
    assert BudgetNotice.objects.filter(user=team_admin).exists()

    settings.BUDGET_ALERT_WEBHOOK_URL = f"http://127.0.0.1:{free_port()}/{uuid.uuid4().hex}"
    settings.BUDGET_ALERT_WEBHOOK_ATTEMPTS = 3
    settings.BUDGET_ALERT_WEBHOOK_BACKOFF_S = 0.01
    RunFactory(team=alpha, pool=fake_pool.pool, created_by=owner, cost_usd=Decimal("0.4"))
    services.on_run_event(_finished(run))  # 90 %: 80 raised, its webhook cannot connect
    delivery = _wait_delivery(BudgetAlert.objects.get(threshold=80))
    assert delivery.status == "failed" and delivery.attempts == 3 and delivery.last_error
    event = AuditEvent.objects.get(event_type="budget.alert_delivered")
    assert event.payload["status"] == "failed" and event.payload["attempts"] == 3
