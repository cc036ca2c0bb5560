"""Access rules for the playground, run pages and the run websocket (format: tests/test_access_matrix.py).

The run is the owner's, on alpha's ``fake`` pool, queued, with one recorded step.
"""

from __future__ import annotations

from typing import Any


def _run(ctx: Any) -> Any:
    from tests.factories.runs import RunFactory, StepFactory

    run = RunFactory(team=ctx.alpha, pool=ctx.fake.pool, created_by=ctx.owner)
    StepFactory(run=run, index=0, worker_key="fake-solver", messages=[{"role": "user", "content": "Q"}])
    return run


def _run_kwargs(ctx: Any) -> dict[str, Any]:
    return {"run_id": ctx.memo("run", _run).id}


SIGNED_IN = {
    "anonymous": "login",
    "owner": 200,
    "teammate": 200,
    "outsider": 200,
    "reviewer": 200,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}
# Alpha's runs: every alpha member (any role) sees them; outsiders get a 404 (no existence leak).
READ_RUN = {**SIGNED_IN, "outsider": 404}
# Acting on a run (cancel, replay): alpha's runners; reviewers see the run but get a 403.
ACT_RUN = {
    "anonymous": "login",
    "owner": 302,
    "teammate": 302,
    "outsider": 404,
    "reviewer": 403,
    "policy_admin": 302,
    "team_admin": 302,
}

RULES: dict[str, Any] = {
    "playground": [
        {**SIGNED_IN, "note": "everyone signed in sees the form; only usable pools are offered"},
        {
            "method": "POST",
            "data": lambda ctx: {"prompt": "hello", "strategy": "conductor-mini", "pool": ctx.fake.pool.pk},
            "anonymous": "login",
            "owner": 302,
            "teammate": 302,
            "policy_admin": 302,
            "team_admin": 302,
            # Not offered the pool: the form re-renders with the error.
            "outsider": 200,
            "reviewer": 200,
        },
    ],
    "runs:list": SIGNED_IN,
    "runs:detail": {"kwargs": _run_kwargs, **READ_RUN},
    "runs:snapshot": {"kwargs": _run_kwargs, **READ_RUN},
    # The short id the pages show: a redirect to the run for whoever may view it, else a 404.
    "runs:short": {
        "kwargs": lambda ctx: {"ref": str(ctx.memo("run", _run).id)[:8]},
        **{role: 302 for role, code in READ_RUN.items() if code == 200},
        "anonymous": "login",
        "outsider": 404,
    },
    "runs:cancel": {"kwargs": _run_kwargs, "method": "POST", **ACT_RUN},
    # Deciding a held plan: team admins and reviewers (the run here waits for nothing: a 302 back
    # with the reason); runners who are not approvers get a 403 naming the permission.
    "runs:plan_decide": {
        "kwargs": _run_kwargs,
        "method": "POST",
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 302,
        "policy_admin": 403,
        "team_admin": 302,
        "superuser": 302,
    },
    "runs:step_replay": {"kwargs": lambda ctx: {**_run_kwargs(ctx), "index": 0}, "method": "POST", **ACT_RUN},
    "ws:run-stream": {
        "path": lambda ctx: f"/ws/runs/{ctx.memo('run', _run).id}/",
        "anonymous": "reject",
        "owner": "accept",
        "teammate": "accept",
        "outsider": "reject",
        "reviewer": "accept",
        "policy_admin": "accept",
        "team_admin": "accept",
        "superuser": "accept",
    },
}
