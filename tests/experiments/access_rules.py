"""Access rules for /experiments/ (format: tests/test_access_matrix.py).

Members who may run on alpha (owner, teammate, policy admin, team admin) see and start alpha's
experiments; alpha's reviewer gets a 403 naming governance.run_on_team; other teams get a 404.
Teaching the learned router needs manage_team (alpha's admins), like the router page itself.
"""

from __future__ import annotations

from typing import Any


def _experiment(ctx: Any) -> Any:
    from apps.experiments.models import Dataset, DatasetItem, Experiment

    dataset = Dataset.objects.create(team=ctx.alpha, name="access", created_by=ctx.owner, row_count=1)
    DatasetItem.objects.create(
        dataset=dataset, index=1, messages=[{"role": "user", "content": "2+2?"}], reference="4"
    )
    return Experiment.objects.create(
        team=ctx.alpha, dataset=dataset, pool=ctx.pool, arms=["pev"], created_by=ctx.owner, status="running"
    )


def _pk(ctx: Any) -> dict[str, Any]:
    return {"pk": ctx.memo("experiment", _experiment).pk}


ALPHA_RUNNERS = {
    "anonymous": "login",
    "owner": 200,
    "teammate": 200,
    "outsider": 404,
    "reviewer": 403,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}
EVERYONE = {
    "anonymous": "login",
    "owner": 200,
    "teammate": 200,
    "outsider": 200,
    "reviewer": 200,
    "policy_admin": 200,
    "team_admin": 200,
    "superuser": 200,
}

RULES: dict[str, Any] = {
    "experiments:list": [
        {**EVERYONE, "note": "lists only the experiments of teams the user may run on"},
        {
            "method": "POST",
            "data": {},
            **{k: (400 if v == 200 else v) for k, v in EVERYONE.items()},
            "note": "an empty form is refused field by field",
        },
    ],
    "experiments:dataset_upload": {
        "method": "POST",
        "data": {},
        **{k: (400 if v == 200 else v) for k, v in EVERYONE.items()},
        "note": "an upload without a file is refused; teams offered are those the user may run on",
    },
    "experiments:detail": {"kwargs": _pk, **ALPHA_RUNNERS},
    "experiments:progress": {"kwargs": _pk, **ALPHA_RUNNERS},
    "experiments:question": {"kwargs": lambda ctx: {**_pk(ctx), "index": 1}, **ALPHA_RUNNERS},
    "experiments:cancel": {
        "kwargs": _pk,
        "method": "POST",
        **{k: (302 if v == 200 else v) for k, v in ALPHA_RUNNERS.items()},
    },
    "experiments:teach": {
        "kwargs": _pk,
        "method": "POST",
        **ALPHA_RUNNERS,
        "owner": 403,
        "teammate": 403,
        "policy_admin": 403,
        "team_admin": 302,
        "superuser": 302,
        "note": "needs manage_team (it changes the team's router); with no scores it says so and redirects",
    },
    # The training export carries questions and answers: team admins only; other teams see no team.
    "experiments:training_export": {
        "kwargs": lambda ctx: {"team_slug": ctx.alpha.slug},
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 404,
        "reviewer": 403,
        "policy_admin": 403,
        "team_admin": 200,
        "superuser": 200,
    },
}
