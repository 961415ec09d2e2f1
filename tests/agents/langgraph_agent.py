"""An agent written with LangGraph, as its documentation shows one: the prebuilt ReAct agent
over LangChain's OpenAI chat model (`langchain-openai`), its tools an MCP server's, loaded with
`langchain-mcp-adapters`. Nothing in it knows about baton's ledger.

baton's worker runs it as a run's agent: ChatOpenAI reads OPENAI_BASE_URL and OPENAI_API_KEY
(the worker's model gateway and this attempt's key); the tools are the run's, served by the
worker's tool gateway at BATON_MCP_URL, which answers the same key.

Environment:
  BATON_INPUT_FILE  the file holding the run's input text (required; read whole)
  BATON_MCP_URL     the MCP server with the run's tools (required)
  AGENT_MODEL       the model to ask (default mock-steps, tests/litellm/steps.yaml)
  AGENT_MAX_TURNS   the graph's recursion limit (default 60)
  AGENT_STREAM      1: the chat model streams (ChatOpenAI's streaming), so every call does

stdout gets one line only, the final answer. Any error leaves through Python's default
handler: a traceback and exit status 1.
"""

import asyncio
import os

from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent


async def main():
    with open(os.environ["BATON_INPUT_FILE"], encoding="utf-8") as f:
        task = f.read()
    servers = {
        "baton": {
            "transport": "streamable_http",
            "url": os.environ["BATON_MCP_URL"],
            "headers": {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
        }
    }
    tools = await MultiServerMCPClient(servers).get_tools()
    streaming = os.environ.get("AGENT_STREAM") == "1"
    model = ChatOpenAI(model=os.environ.get("AGENT_MODEL", "mock-steps"), streaming=streaming)
    agent = create_react_agent(model, tools)
    limit = int(os.environ.get("AGENT_MAX_TURNS", "60"))
    result = await agent.ainvoke({"messages": [("user", task)]}, {"recursion_limit": limit})
    print(result["messages"][-1].content)


if __name__ == "__main__":
    asyncio.run(main())
