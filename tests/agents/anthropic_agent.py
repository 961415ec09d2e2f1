"""An agent written with the stock `anthropic` SDK's tool loop, as its documentation shows one:
ask the model with the tools, run the `tool_use` blocks it answers with, send back their
`tool_result`s, until it answers without one. Its tools are an MCP server's (the stock `mcp`
client). Nothing in it knows about baton's ledger.

baton's worker runs it as a run's agent: the SDK reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY
(the worker's gateway and this attempt's key); the tools are the run's, served by the worker's
tool gateway at BATON_MCP_URL, which answers the same key. Odd calls stream (the SDK's
`messages.stream` helper) and even ones do not, so one run drives both forms of the Messages
API through the gateway.

Environment:
  BATON_INPUT_FILE  the file holding the run's input text (required; read whole)
  BATON_MCP_URL     the MCP server with the run's tools (required)
  AGENT_MODEL       the model to ask (default claude-haiku-4-5)
  AGENT_MAX_TURNS   the most model calls before giving up with an error (default 30)

stdout gets one line only, the final answer. Any error leaves through Python's default
handler: a traceback and exit status 1.
"""

import asyncio
import os
import sys

import anthropic
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


async def ask(client, turn, **request):
    """One call of the Messages API: the message, streamed on odd turns."""
    if turn % 2 == 1:
        async with client.messages.stream(**request) as stream:
            return await stream.get_final_message()
    return await client.messages.create(**request)


async def converse(session, client, model, task, max_turns):
    listed = await session.list_tools()
    tools = [{"name": t.name, "description": t.description or "", "input_schema": t.inputSchema} for t in listed.tools]
    messages = [{"role": "user", "content": task}]
    for turn in range(1, max_turns + 1):
        message = await ask(client, turn, model=model, max_tokens=1024, messages=messages, tools=tools)
        uses = [block for block in message.content if block.type == "tool_use"]
        print(f"turn {turn}: {len(uses)} tool use(s)", file=sys.stderr)
        if not uses:
            return "".join(block.text for block in message.content if block.type == "text")
        messages.append({"role": "assistant", "content": [block.model_dump() for block in message.content]})
        results = []
        for use in uses:
            result = await session.call_tool(use.name, use.input)
            text = "".join(block.text for block in result.content if block.type == "text")
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": text, "is_error": result.isError})
        messages.append({"role": "user", "content": results})
    raise RuntimeError(f"no final answer after {max_turns} model calls")


async def main():
    with open(os.environ["BATON_INPUT_FILE"], encoding="utf-8") as f:
        task = f.read()
    model = os.environ.get("AGENT_MODEL", "claude-haiku-4-5")
    max_turns = int(os.environ.get("AGENT_MAX_TURNS", "30"))
    headers = {"Authorization": f"Bearer {os.environ['ANTHROPIC_API_KEY']}"}
    url = os.environ["BATON_MCP_URL"]
    async with streamablehttp_client(url, headers=headers, timeout=30, sse_read_timeout=300) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            answer = await converse(session, anthropic.AsyncAnthropic(), model, task, max_turns)
    print(answer)


if __name__ == "__main__":
    asyncio.run(main())
