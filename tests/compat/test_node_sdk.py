"""OpenAI's Node SDK (npm ``openai``, run with ``node``) against the live server (issue 22): a
plain completion with its headers, ``max_tokens`` → ``length``, and streamed tool calls.

The npm package is installed at test time into ``var/node-openai`` (gitignored); without npm or
the registry the test is skipped with the reason — unless ``CI=true``, where it must run."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.base import FakeReply
from tests.fixtures.api import PLAN_TEXT
from tests.runtime import IN_CI

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

NODE_DIR = Path(__file__).resolve().parents[2] / "var" / "node-openai"

SCRIPT = r"""
const OpenAI = require("openai");
const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY, maxRetries: 0 });
const tool = { type: "function", function: { name: "get_weather",
  parameters: { type: "object", properties: { city: { type: "string" } } } } };
(async () => {
  const { data, response } = await client.chat.completions
    .create({ model: "conductor-mini", messages: [{ role: "user", content: "Story?" }], max_tokens: 3 })
    .withResponse();
  const stream = await client.chat.completions.create({
    model: "fake", messages: [{ role: "user", content: "Weather in Paris?" }], tools: [tool], stream: true });
  let args = "", name = null, finish = null;
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    for (const tc of choice.delta.tool_calls || []) {
      if (tc.function && tc.function.name) name = tc.function.name;
      if (tc.function && tc.function.arguments) args += tc.function.arguments;
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  console.log(JSON.stringify({
    content: data.choices[0].message.content, finish: data.choices[0].finish_reason,
    requestId: response.headers.get("x-request-id"),
    remaining: response.headers.get("x-ratelimit-remaining-requests"),
    tool: { name, args, finish } }));
})().catch((err) => { console.error(String(err)); process.exit(1); });
"""


def node_openai() -> Path:
    """The directory holding node_modules/openai (installed on first use)."""
    if (NODE_DIR / "node_modules" / "openai").is_dir():
        return NODE_DIR
    npm = shutil.which("npm")
    reason = None
    if npm is None or shutil.which("node") is None:
        reason = "node/npm are not installed"
    else:
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        (NODE_DIR / "package.json").write_text('{"private": true}\n')
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--silent", "openai@^4"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            reason = f"npm install openai failed: {done.stderr.strip()[-300:]}"
    if reason is not None:
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    return NODE_DIR


def test_node_sdk_completion_headers_length_and_streamed_tool_calls(
    fake_pool: Any, api_server: Any, runtime_workers: Any, api_key: tuple[Any, str], tmp_path: Path
) -> None:
    where = node_openai()

    def respond(req: dict[str, Any]) -> Any:
        if req.get("model") == "fake-conductor-1":
            return PLAN_TEXT
        if req.get("tools"):
            return FakeReply(
                tool_calls=[{"id": "call_9", "name": "get_weather", "arguments": '{"city":"Paris"}'}]
            )
        return " ".join(f"w{i}" for i in range(40))

    fake_pool.server.responder = respond
    script = tmp_path / "client.js"
    script.write_text(SCRIPT)
    done = subprocess.run(
        ["node", str(script)],
        cwd=where,
        env={
            "PATH": "/usr/bin:/bin",
            "NODE_PATH": str(where / "node_modules"),
            "BASE_URL": f"{api_server.url}/v1",
            "API_KEY": api_key[1],
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["finish"] == "length" and len(out["content"].split()) <= 3
    assert out["requestId"].startswith("req_") and out["remaining"] is not None
    assert out["tool"] == {"name": "get_weather", "args": '{"city":"Paris"}', "finish": "tool_calls"}
