"""Real MCP servers for the tool tests: the SDK's server over streamable HTTP on the fake
providers' loopback address (the one EGRESS_ALLOW opens in tests) and over stdio."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

SCRIPT = Path(__file__).resolve().parents[1] / "fakes" / "mcp_server.py"


@dataclass
class McpServer:
    log: Path
    tools_file: Path
    url: str = ""
    command: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def set_description(self, tool: str, text: str) -> None:
        """Change what the server announces (a "rug pull"); HTTP servers are restarted to read it."""
        current = json.loads(self.tools_file.read_text()) if self.tools_file.exists() else {}
        current[tool] = text
        self.tools_file.write_text(json.dumps(current))
        if self.proc is not None:
            self.stop()
            self.start()

    def start(self) -> None:
        env = {"MCP_FAKE_LOG": str(self.log), "MCP_FAKE_TOOLS": str(self.tools_file), "PATH": "/usr/bin:/bin"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(SCRIPT),
                "http",
                "--host",
                settings.FAKE_PROVIDER_HOST,
                "--port",
                str(self.port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection((settings.FAKE_PROVIDER_HOST, self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the MCP test server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@pytest.fixture
def mcp_http(tmp_path: Path) -> Iterator[McpServer]:
    host = settings.FAKE_PROVIDER_HOST
    server = McpServer(
        log=tmp_path / "calls.jsonl", tools_file=tmp_path / "tools.json", port=_free_port(host)
    )
    server.url = f"http://{host}:{server.port}/mcp"
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mcp_stdio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> McpServer:
    """A stdio server: the command runs the same script; the env file paths ride in its argv-free
    environment, so the test points the script at them through a wrapper script."""
    log = tmp_path / "stdio-calls.jsonl"
    tools = tmp_path / "stdio-tools.json"
    wrapper = tmp_path / "stdio_server.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        f"os.environ['MCP_FAKE_LOG'] = {str(log)!r}\n"
        f"os.environ['MCP_FAKE_TOOLS'] = {str(tools)!r}\n"
        "sys.argv = ['mcp_server', 'stdio']\n"
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
    )
    return McpServer(log=log, tools_file=tools, command=[sys.executable, str(wrapper)])


@pytest.fixture
def crm(alpha: Any, policy_admin: Any, mcp_http: McpServer) -> Any:
    """The alpha team's HTTP tool server, discovered, every tool accepted."""
    from apps.tools.services import tool_server_discover, tool_server_register, tool_version_accept

    server = tool_server_register(
        actor=policy_admin, team=alpha, slug="crm", name="CRM", transport="http", url=mcp_http.url,
        credential="crm-token-12345678",
    )  # fmt: skip
    for version in tool_server_discover(actor=policy_admin, server=server):
        tool_version_accept(actor=policy_admin, version=version)
    return server
