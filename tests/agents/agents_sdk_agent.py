"""An agent written with the OpenAI Agents SDK (`openai-agents`), as its documentation shows one:
an Agent with instructions, a model and an MCP server for its tools, run by the Runner until it
gives its final output. Nothing in it knows about baton's ledger.

baton's worker runs it as a run's agent. The SDK's own OpenAI client reads OPENAI_BASE_URL and
OPENAI_API_KEY (the worker's model gateway and this attempt's key); the tools are the run's,
served by the worker's tool gateway at BATON_MCP_URL, which answers the same key. The agent
uses the SDK's Chat Completions model class (OpenAIChatCompletionsModel), or its Responses
model class with AGENT_API=responses. Tracing to OpenAI's platform is off, as for any agent
that does not use it.

Environment:
  BATON_INPUT_FILE  the file holding the run's input text (required; read whole)
  BATON_MCP_URL     the MCP server with the run's tools (required)
  AGENT_MODEL       the model to ask (default mock-steps, tests/litellm/steps.yaml)
  AGENT_API         chat (default) or responses: the SDK's model class
  AGENT_MAX_TURNS   the Runner's max_turns (default 30)
  AGENT_STREAM      1: the Runner streams (Runner.run_streamed), so every model call does
  AGENT_PROMPT_TIME 1: the instructions end with the time now, as an agent that tells its
                    model the time does (resumed, it asks otherwise: a divergent agent)

stdout gets one line only, the final output. Any error leaves through Python's default
handler: a traceback and exit status 1.
"""

import asyncio
import os
import time

from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp
from openai import AsyncOpenAI


async def main():
    with open(os.environ["BATON_INPUT_FILE"], encoding="utf-8") as f:
        task = f.read()
    set_tracing_disabled(True)
    name = os.environ.get("AGENT_MODEL", "mock-steps")
    model_class = OpenAIResponsesModel if os.environ.get("AGENT_API") == "responses" else OpenAIChatCompletionsModel
    model = model_class(model=name, openai_client=AsyncOpenAI())
    tools = MCPServerStreamableHttp(
        name="baton",
        params={
            "url": os.environ["BATON_MCP_URL"],
            "headers": {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
            # A tool may run for minutes.
            "timeout": 30,
            "sse_read_timeout": 600,
        },
        client_session_timeout_seconds=600,
    )
    async with tools:
        instructions = "You are a careful operator. Use the tools, one step at a time."
        if os.environ.get("AGENT_PROMPT_TIME") == "1":
            instructions += f" The time is {time.time_ns()} ns since the epoch."
        agent = Agent(
            name="steps",
            instructions=instructions,
            model=model,
            mcp_servers=[tools],
        )
        max_turns = int(os.environ.get("AGENT_MAX_TURNS", "30"))
        if os.environ.get("AGENT_STREAM") == "1":
            result = Runner.run_streamed(agent, task, max_turns=max_turns)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, task, max_turns=max_turns)
    print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
