"""A plain agent, written with the stock `openai` SDK as any user would write one: nothing in it
knows about baton. baton's worker runs it as a run's agent and points the SDK at its own
OpenAI-compatible gateway through the SDK's standard variables, OPENAI_BASE_URL (the gateway on
the pod's loopback) and OPENAI_API_KEY (a token for this attempt alone), so every model call
goes through baton, which records it.

It keeps one conversation going for AGENT_CALLS model calls. Odd calls stream and even ones do
not, so one run drives both forms of the API through the gateway: Chat Completions, or the
Responses API with AGENT_API=responses.

Environment:
  BATON_INPUT_FILE  the file holding the run's input text (required; read whole)
  BATON_HISTORY_FILE  for a thread's turn: the earlier turns' conversation (Chat Completions
                    messages, JSON), put after the system message, as a chat agent keeps one
  AGENT_MODEL       the model to ask (default mock-gpt, a mock of tests/litellm/config.yaml)
  AGENT_API         chat (the default: client.chat.completions) or responses (client.responses)
  AGENT_CALLS       how many model calls to make (default 6)
  AGENT_PAUSE_MS    a pause before every call after the first (default 0), so that a test can
                    kill the pod while the run is between calls
  AGENT_DIVERGE     1: the system message carries the wall-clock time, so the requests differ
                    from one attempt to the next (a non-deterministic agent)

Progress goes to stderr; stdout gets one line only, the final answer, so a test can compare it
whole. Any error leaves through Python's default handler: a traceback and exit status 1.
"""

import json
import os
import sys
import time
from datetime import datetime

import openai


def ask(client, model, messages, stream):
    """One model call; the assistant's answer as text, streamed or not."""
    if not stream:
        response = client.chat.completions.create(model=model, messages=messages)
        return response.choices[0].message.content or ""
    # include_usage: the last chunk carries the token counts and no choices, as the OpenAI API
    # sends it; asked for because agent SDKs do, and the gateway must relay that chunk too.
    chunks = client.chat.completions.create(
        model=model,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts = []
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.delta.content:
                parts.append(choice.delta.content)
    return "".join(parts)


def ask_responses(client, model, messages, stream):
    """One call of the Responses API, the conversation sent whole; the answer's text."""
    if not stream:
        return client.responses.create(model=model, input=messages).output_text
    parts = []
    for event in client.responses.create(model=model, input=messages, stream=True):
        if event.type == "response.output_text.delta":
            parts.append(event.delta)
    return "".join(parts)


def main():
    with open(os.environ["BATON_INPUT_FILE"], encoding="utf-8") as f:
        task = f.read()
    model = os.environ.get("AGENT_MODEL", "mock-gpt")
    calls = int(os.environ.get("AGENT_CALLS", "6"))
    pause = int(os.environ.get("AGENT_PAUSE_MS", "0")) / 1000

    system = "You are a careful assistant. Answer briefly."
    if os.environ.get("AGENT_DIVERGE") == "1":
        system += f" The time is {datetime.now().isoformat()}."

    # The SDK reads OPENAI_BASE_URL and OPENAI_API_KEY itself, as in any user's code.
    client = openai.OpenAI()
    messages = [{"role": "system", "content": system}]
    if os.environ.get("BATON_HISTORY_FILE"):
        with open(os.environ["BATON_HISTORY_FILE"], encoding="utf-8") as f:
            messages += json.load(f)
    answer = ""
    for i in range(1, calls + 1):
        if i > 1 and pause:
            time.sleep(pause)
        messages.append({"role": "user", "content": f"step {i} of {calls}: {task}"})
        asking = ask_responses if os.environ.get("AGENT_API") == "responses" else ask
        answer = asking(client, model, messages, stream=i % 2 == 1)
        messages.append({"role": "assistant", "content": answer})
        print(f"call {i}: {answer[:40]}", file=sys.stderr, flush=True)

    print(f"answer after {calls} calls: {answer}")


if __name__ == "__main__":
    main()
