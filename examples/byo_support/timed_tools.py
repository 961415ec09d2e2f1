"""The tool-calling agent `make bench-byo` runs (examples/byo_bench.rs): the stock `mcp` client
timing each call of the run's shell tool `sh` it makes through baton's tool gateway
(BATON_MCP_URL, as any agent would reach it). It asks no model.

Environment:
  BATON_INPUT_FILE  the run's input (read, as an agent would; not otherwise used)
  BATON_MCP_URL     the tool gateway; OPENAI_API_KEY, the attempt's key, goes as the bearer
  AGENT_TOOL_CALLS  how many calls to make, each `echo <n>`
  AGENT_HOLD_AFTER  on the first attempt only (BATON_ATTEMPT 1): after this many calls, wait
                    to be killed (the bench resumes the run and times the replayed calls)

Prints one JSON line to stdout (the run's output): each call's milliseconds, and the wall-clock
time (epoch seconds) when the first call past AGENT_HOLD_AFTER began.
"""

import asyncio
import json
import os
import time

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


async def main():
    with open(os.environ["BATON_INPUT_FILE"], encoding="utf-8") as f:
        f.read()
    calls = int(os.environ["AGENT_TOOL_CALLS"])
    hold_after = int(os.environ.get("AGENT_HOLD_AFTER", "0"))
    first_attempt = os.environ.get("BATON_ATTEMPT") == "1"
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    report = {"tool_ms": [], "past_hold_at": None}
    async with streamablehttp_client(os.environ["BATON_MCP_URL"], headers=headers) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            for i in range(1, calls + 1):
                if hold_after and i == hold_after + 1:
                    if first_attempt:
                        await asyncio.sleep(3600)
                    report["past_hold_at"] = time.time()
                started = time.perf_counter()
                result = await session.call_tool("sh", {"command": f"echo {i}"})
                report["tool_ms"].append((time.perf_counter() - started) * 1000)
                if result.isError:
                    raise RuntimeError(f"call {i} failed: {result.content}")
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
