"""What a batch adds to the run row's counters, written with the batch's lease fence in one UPDATE."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any
from uuid import UUID

from django.db import connection

from apps.core.compiled import execute
from apps.governance.access_version import TABLE as ACCESS_TABLE
from apps.runs.models import Run


@dataclass(frozen=True, slots=True)
class BatchUsage:
    """What a batch's events add to the run's counters: the conductor's usage (plan.proposed) and
    each ended step's (step.finished). ``cost_usd`` None: nothing priced (the cost stays as it
    is, NULL included); ``unpriced``: some call could not be priced (``priced`` turns false)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Decimal | None = None
    unpriced: bool = False
    steps: int = 0


NO_USAGE = BatchUsage()


@cache
def _counters_sql(vendor: str, fenced: bool) -> str:
    qn = connection.ops.quote_name
    greatest = "GREATEST" if vendor == "postgresql" else "MAX"  # Django's Greatest on each
    seq, cost = qn("last_seq"), qn("cost_usd")
    adds = ", ".join(f"{qn(c)} = {qn(c)} + %s" for c in ("input_tokens", "output_tokens", "step_count"))
    where = f"{qn('id')} = %s" + (
        f" AND {qn('lease_owner')} = %s AND {qn('attempts')} = %s" if fenced else ""
    )
    # Identifiers from model metadata (quoted); every value is a parameter. One text for every
    # batch: adding zeros costs the database nothing, compiling an ORM UPDATE with expressions
    # for each batch cost more than the statement (issue #15). It also returns the access version
    # the batch is published with (apps.runs.ws_access): no round trip of its own.
    return (
        f"UPDATE {qn(Run._meta.db_table)} SET {seq} = {greatest}({seq}, %s), {adds}, "  # noqa: S608
        f"{cost} = CASE WHEN %s THEN COALESCE({cost}, 0) + CAST(%s AS NUMERIC) ELSE {cost} END, "
        f"{qn('priced')} = ({qn('priced')} AND %s) WHERE {where} "
        f"RETURNING (SELECT {qn('stamp')} FROM {qn(ACCESS_TABLE)} WHERE {qn('id')} = 1)"
    )


def _store_counters(
    run_id: UUID | str, last_seq: int, usage: BatchUsage, *, owner: str | None = None, attempt: int = 0
) -> tuple[int, int | None]:
    """Move the run's last_seq to ``last_seq`` (never back) and add ``usage`` to its counters, in
    one UPDATE. With ``owner``, the batch's lease fence: the row changes only if this executor
    still holds the run (same owner, same attempt). Returns the rows changed and the access
    version (``apps.governance.access_version``) read by the same statement."""
    pk = Run._meta.pk.get_db_prep_value(run_id, connection)  # type: ignore[union-attr]
    params: list[Any] = [
        last_seq,
        usage.input_tokens,
        usage.output_tokens,
        usage.steps,
        usage.cost_usd is not None,
        usage.cost_usd if usage.cost_usd is not None else Decimal(0),
        not usage.unpriced,
        pk,
    ]
    if owner is not None:
        params += [owner, attempt]
    # Bound on the server, prepared once per connection (apps.core.compiled.execute): one of
    # these per batch was a tenth of the sink's database time bound in Python (issue #15).
    changed, rows = execute(
        connection, _counters_sql(connection.vendor, owner is not None), params, fetch=True
    )
    return changed, (rows[0][0] if rows else None)


def _usage(batch: list[dict[str, Any]]) -> BatchUsage:
    """What a batch's events add to the run's counters."""
    tokens = {"input_tokens": 0, "output_tokens": 0}
    cost: Decimal | None = None
    unpriced = False
    steps = 0
    for event in batch:
        kind = event["type"]
        if kind not in ("plan.proposed", "step.finished"):
            continue
        data = event["data"]
        usage = data.get("usage") or {}
        for field in tokens:
            tokens[field] += int(usage.get(field) or 0)
        amount = _decimal(data.get("cost_usd"))
        if amount is not None:  # even 0: a priced run's cost is never left NULL
            cost = amount if cost is None else cost + amount
        if data.get("priced") is False:
            unpriced = True
        if kind == "step.finished":
            steps += 1
    if not (steps or unpriced or cost is not None or any(tokens.values())):
        return NO_USAGE
    return BatchUsage(cost_usd=cost, unpriced=unpriced, steps=steps, **tokens)


def _decimal(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None
