"""The agent `make bench-byo` runs (examples/byo_bench.rs): the stock `openai` SDK, timing each
call it makes through baton's gateway (OPENAI_BASE_URL, as any agent would reach it) and, when
DIRECT_BASE_URL is set, the same call made straight to the model server, for the difference.

Environment:
  BATON_INPUT_FILE  the run's input (read, as an agent would; not otherwise used)
  AGENT_MODEL       the model to ask (default mock-gpt)
  AGENT_CALLS       how many calls to make
  AGENT_HOLD_AFTER  on the first attempt only (BATON_ATTEMPT 1): after this many calls, wait
                    to be killed (the bench resumes the run and times the replay)
  DIRECT_BASE_URL, DIRECT_API_KEY  the model server itself, for the direct calls
  AGENT_STREAM      1: every call streamed, and the time to its first content chunk kept too

Prints one JSON line to stdout (the run's output): each call's milliseconds through the
gateway and direct (for a stream, to its end and to its first content chunk), and the
wall-clock time (epoch seconds) when the first call past AGENT_HOLD_AFTER began.
"""

import json
import os
import time

import openai


def timed(client, model, messages):
    """The call's milliseconds, to its first content (None unless streamed), and its answer."""
    started = time.perf_counter()
    if os.environ.get("AGENT_STREAM") != "1":
        answer = client.chat.completions.create(model=model, messages=messages)
        return (time.perf_counter() - started) * 1000, None, answer.choices[0].message.content or ""
    first, text = None, ""
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True):
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            if first is None:
                first = (time.perf_counter() - started) * 1000
            text += delta
    return (time.perf_counter() - started) * 1000, first, text


def main():
    with open(os.environ["BATON_INPUT_FILE"], encoding="utf-8") as f:
        f.read()
    model = os.environ.get("AGENT_MODEL", "mock-gpt")
    calls = int(os.environ["AGENT_CALLS"])
    hold_after = int(os.environ.get("AGENT_HOLD_AFTER", "0"))
    first_attempt = os.environ.get("BATON_ATTEMPT") == "1"
    # No retries: a failed call shows in the figures instead of hiding in a retry.
    through = openai.OpenAI(max_retries=0)
    direct = None
    if os.environ.get("DIRECT_BASE_URL"):
        direct = openai.OpenAI(
            base_url=os.environ["DIRECT_BASE_URL"],
            api_key=os.environ["DIRECT_API_KEY"],
            max_retries=0,
        )
    report = {"gateway_ms": [], "direct_ms": [], "gateway_first_ms": [], "direct_first_ms": [], "past_hold_at": None}
    messages = [{"role": "system", "content": "Answer briefly."}]
    for i in range(1, calls + 1):
        if hold_after and i == hold_after + 1:
            if first_attempt:
                time.sleep(3600)
            report["past_hold_at"] = time.time()
        messages.append({"role": "user", "content": f"step {i}"})
        if direct:
            ms, first, _ = timed(direct, model, messages)
            report["direct_ms"].append(ms)
            report["direct_first_ms"].append(first)
        ms, first, answer = timed(through, model, messages)
        report["gateway_ms"].append(ms)
        report["gateway_first_ms"].append(first)
        messages.append({"role": "assistant", "content": answer})
    print(json.dumps(report))


if __name__ == "__main__":
    main()
