"""Drives sshmode's MCP endpoint with the official MCP Python SDK (PyPI `mcp`, pinned in
scripts/test.sh) for tests/api/mcp.rs.

Reads a plan as JSON on stdin:
  {"url", "token", "mode": "legacy" | "2026-07-28", "origin"?: str,
   "steps": [{"tool", "args", "progress"?: bool, "cancel_after"?: seconds}]}
(an argument "{{N.key}}" is replaced by `key` of step N's structured result, e.g. a shell_id)
and prints one JSON object: {"tools": [names], "results": [{"is_error", "structured", "text",
"progress"}] ({"cancelled": true} for a step the client cancelled)}, or {"error": "..."} when the connection or a call failed outright.
"""

import asyncio
import json
import sys

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def fill(value, results):
    if isinstance(value, str) and value.startswith("{{") and value.endswith("}}"):
        n, key = value[2:-2].split(".", 1)
        return results[int(n)]["structured"][key]
    return value


async def main(plan):
    headers = {"Authorization": f"Bearer {plan['token']}"}
    if plan.get("origin"):
        headers["Origin"] = plan["origin"]
    http = create_mcp_http_client(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0))
    out = {"tools": [], "results": []}
    async with http:
        async with Client(
            streamable_http_client(plan["url"], http_client=http),
            mode=plan["mode"],
            raise_exceptions=True,
        ) as client:
            listed = await client.list_tools()
            out["tools"] = sorted(t.name for t in listed.tools)
            for step in plan.get("steps", []):
                seen = []

                async def on_progress(progress, total, message, seen=seen):
                    seen.append({"progress": progress, "message": message})

                with anyio.move_on_after(step.get("cancel_after", 3600)) as scope:
                    r = await client.call_tool(
                        step["tool"],
                        {k: fill(v, out["results"]) for k, v in step.get("args", {}).items()},
                        progress_callback=on_progress if step.get("progress") else None,
                    )
                if scope.cancelled_caught:
                    out["results"].append({"cancelled": True})
                    continue
                text = "".join(getattr(c, "text", "") for c in r.content)
                out["results"].append(
                    {
                        "is_error": bool(r.is_error),
                        "structured": r.structured_content,
                        "text": text,
                        "progress": seen,
                    }
                )
    return out


if __name__ == "__main__":
    plan = json.load(sys.stdin)
    try:
        result = asyncio.run(main(plan))
    except BaseException as e:  # noqa: BLE001 - the test reads what failed
        parts = [repr(e)]
        for sub in getattr(e, "exceptions", []) or []:
            parts.append(repr(sub))
        result = {"error": " | ".join(parts)}
    print(json.dumps(result))
