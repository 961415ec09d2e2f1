"""An agent with tools, written with the stock `openai` SDK and the stock `mcp` client SDK as any
user would write one: nothing in it knows about baton's ledger. It lists the tools of one MCP
server, offers them to the model, calls the ones the model picks and sends their results back,
until the model answers without a tool call.

baton's worker runs it as a run's agent: OPENAI_BASE_URL and OPENAI_API_KEY point the SDK at
the worker's model gateway, and BATON_MCP_URL names the worker's tool gateway, an MCP server
(Streamable HTTP) that serves the run's tools and answers the same key as a bearer token. Every
model call and every tool call goes through baton, which records it; a resumed attempt runs
this script again from the top and baton answers what it recorded.

Environment:
  BATON_INPUT_FILE  the file holding the run's input text (required; read whole)
  BATON_MCP_URL     the MCP server with the run's tools (required)
  AGENT_MODEL       the model to ask (default mock-gpt)
  AGENT_MAX_TURNS   the most model calls before giving up with an error (default 30)

Progress goes to stderr; stdout gets one line only, the final answer. Any error leaves through
Python's default handler: a traceback and exit status 1.
"""

import asyncio
import json
import os
import sys

import openai
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


def offered(listed):
    """The MCP server's tools as the Chat Completions API takes them."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description or "",
                "parameters": tool.inputSchema,
            },
        }
        for tool in listed.tools
    ]


def text_of(result):
    """A tool result's text, marked when the server says the call failed."""
    text = "".join(block.text for block in result.content if block.type == "text")
    return f"ERROR: {text}" if result.isError else text


async def converse(session, client, model, task, max_turns):
    tools = offered(await session.list_tools())
    messages = [
        {"role": "system", "content": "You are a careful assistant. Use the tools."},
        {"role": "user", "content": task},
    ]
    for turn in range(max_turns):
        response = await client.chat.completions.create(model=model, messages=messages, tools=tools)
        message = response.choices[0].message
        calls = message.tool_calls or []
        print(f"turn {turn + 1}: {len(calls)} tool call(s)", file=sys.stderr)
        if not calls:
            return message.content or ""
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": call.function.arguments},
                    }
                    for call in calls
                ],
            }
        )
        for call in calls:
            arguments = json.loads(call.function.arguments or "{}")
            result = await session.call_tool(call.function.name, arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text_of(result)})
    raise RuntimeError(f"no final answer after {max_turns} model calls")


async def main():
    with open(os.environ["BATON_INPUT_FILE"], encoding="utf-8") as f:
        task = f.read()
    model = os.environ.get("AGENT_MODEL", "mock-gpt")
    max_turns = int(os.environ.get("AGENT_MAX_TURNS", "30"))
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    # A tool may run for minutes: the read timeout is the MCP SDK's own default.
    url = os.environ["BATON_MCP_URL"]
    async with streamablehttp_client(url, headers=headers, timeout=30, sse_read_timeout=300) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            answer = await converse(session, openai.AsyncOpenAI(), model, task, max_turns)
    print(answer)


if __name__ == "__main__":
    asyncio.run(main())
