"""A LiteLLM callback that makes a mock model act as a deterministic agent's model: for a
conversation that holds fewer than BATON_STEPS tool results it answers with a call of the first
tool it is offered, for step n+1 (n the results so far), with the arguments
{"command": BATON_STEP_COMMAND with {n} replaced}; once the conversation holds BATON_STEPS
results, it answers the final text "done after <n> steps". Its answers depend on the request
alone, so a replayed agent asks the same and gets the same, as from a model at temperature 0.

tests/litellm/steps.yaml loads it beside count_calls.py: LiteLLM's proxy resolves
`steps_policy.handler` in the config file's own directory and wants an instance of
CustomLogger there. The mock answers are set in the pre-call hook, which runs after the proxy
has dropped any mock field a client sent.

One more setting: BATON_STEP_ARGUMENT, the name of the tool call's one argument (default
"command"; "question" for an askUser tool).

Chat Completions requests carry their tool results as messages of role `tool`; Responses
requests as input items of type `function_call_output`. Both are counted.
"""

import json
import os

from litellm.integrations.custom_logger import CustomLogger


def tool_results(data):
    """The tool results the request's conversation holds."""
    messages = data.get("messages") or []
    if not messages and isinstance(data.get("input"), list):
        messages = data["input"]
    return sum(
        1
        for m in messages
        if isinstance(m, dict) and (m.get("role") == "tool" or m.get("type") == "function_call_output")
    )


def first_tool(data):
    """The name of the first tool the request offers (Chat Completions or Responses form)."""
    for tool in data.get("tools") or []:
        name = (tool.get("function") or {}).get("name") or tool.get("name")
        if name:
            return name
    return None


class StepsPolicy(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):
        steps = int(os.environ.get("BATON_STEPS", "10"))
        done = tool_results(data)
        tool = first_tool(data)
        if done < steps and tool:
            command = os.environ.get("BATON_STEP_COMMAND", "echo step {n}").replace("{n}", str(done + 1))
            argument = os.environ.get("BATON_STEP_ARGUMENT", "command")
            data["mock_tool_calls"] = [
                {
                    "id": f"call_{done + 1}",
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps({argument: command})},
                }
            ]
        else:
            data["mock_response"] = f"done after {done} steps"
        return data


handler = StepsPolicy()
