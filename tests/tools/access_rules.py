"""Access rules for the tool pages (format: tests/test_access_matrix.py).

Alpha's HTTP tool server (on an address the egress rules allow but nothing listens on, so a
discovery fails quickly into a message), one pending tool version, and one held tool call.
"""

from __future__ import annotations

from typing import Any


def _server(ctx: Any) -> Any:
    from apps.tools.services import tool_server_register

    return tool_server_register(
        actor=None, team=ctx.alpha, slug="crm", name="CRM", transport="http", url="http://127.0.13.1:9/mcp"
    )


def _version(ctx: Any) -> Any:
    from apps.tools.models import Tool, ToolVersion

    tool = Tool.objects.create(server=ctx.memo("server", _server), name="add")
    return ToolVersion.objects.create(
        tool=tool, number=1, description="Add.", input_schema={}, digest="0" * 64
    )


def _approval(ctx: Any) -> Any:
    from apps.tools.models import ToolApproval, ToolCall

    call = ToolCall.objects.create(
        team=ctx.alpha, qualified_name="crm.add", arguments_digest="1" * 64, status="pending_approval"
    )
    return ToolApproval.objects.create(
        team=ctx.alpha,
        call=call,
        qualified_name="crm.add",
        arguments_digest="1" * 64,
        rule="tools.default_action",
    )


# Discover / accept: alpha's admins and policy admins; members and reviewers see the server (403);
# other teams get a 404.
MANAGE = {
    "anonymous": "login",
    "owner": 403,
    "teammate": 403,
    "outsider": 404,
    "reviewer": 403,
    "policy_admin": 302,
    "team_admin": 302,
    "superuser": 302,
}

RULES = {
    # Anyone who configures some team may open the form; others get a 403.
    "tools:server_create": {
        "anonymous": "login",
        "owner": 403,
        "teammate": 403,
        "outsider": 403,
        "reviewer": 403,
        "policy_admin": 200,
        "team_admin": 200,
        "superuser": 200,
    },
    "tools:server_discover": {
        "method": "POST",
        "kwargs": lambda ctx: {"slug": ctx.memo("server", _server).slug},
        **MANAGE,
    },
    "tools:version_accept": {
        "method": "POST",
        "kwargs": lambda ctx: {"pk": ctx.memo("version", _version).pk},
        **MANAGE,
    },
    "tools:approval_desk": {
        "anonymous": "login",
        "owner": 200,
        "teammate": 200,
        "outsider": 200,
        "reviewer": 200,
        "policy_admin": 200,
        "team_admin": 200,
        "superuser": 200,
    },
    # Only holders of review_team_runs on alpha find the held call (an unknown decision changes
    # nothing and redirects back to the desk).
    "tools:approval_decide": {
        "method": "POST",
        "kwargs": lambda ctx: {"pk": ctx.memo("approval", _approval).pk},
        "data": {"decision": "neither"},
        "anonymous": "login",
        "owner": 404,
        "teammate": 404,
        "outsider": 404,
        "reviewer": 302,
        "policy_admin": 404,
        "team_admin": 302,
        "superuser": 302,
    },
}
