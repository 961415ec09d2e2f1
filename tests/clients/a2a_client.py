"""The official `a2a-sdk` client against a baton thread's A2A agent, unchanged: it reads the
agent card and picks its transport from it; only the bearer token on its HTTP client is the
caller's. Prints one JSON line per thing seen, for the test to check.

    a2a_client.py stream AGENT_URL TOKEN LEAVE_AFTER
        message/stream; leave after LEAVE_AFTER events; come back with tasks/resubscribe
        (the ledger-cursor extension's header: after the last event seen) until the end;
        then tasks/get.
    a2a_client.py node AGENT_URL OTHER_URL TOKEN
        message/stream through AGENT_URL; whenever the stream is cut (its server gone),
        tasks/resubscribe through OTHER_URL after the last event seen, until the end.
    a2a_client.py resubscribe AGENT_URL TOKEN TASK
        tasks/resubscribe without a cursor: the task as it stands, then its tail.
    a2a_client.py conversation AGENT_URL TOKEN TURNS
        TURNS blocking message/send, each a turn of the thread.
    a2a_client.py cancel AGENT_URL TOKEN
        message/send (not blocking), tasks/cancel, tasks/get until it has ended.
"""

import asyncio
import json
import sys
import uuid

import httpx
from a2a.client import ClientCallContext, ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from google.protobuf.json_format import MessageToDict

CURSOR = "https://baton.dev/a2a/ledger-cursor/v1"
ENDED = (TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED)


def say(**fields):
    print(json.dumps(fields), flush=True)


def number(event):
    metadata = MessageToDict(event.metadata) if event.metadata else {}
    return int(metadata.get(CURSOR, {}).get("sequenceNumber", -1))


def seen(response):
    """One streamed response as the test checks it; (task id, its number, ended)."""
    kind = response.WhichOneof("payload")
    if kind == "task":
        task = response.task
        say(seen="task", task=task.id, context=task.context_id, state=TaskState.Name(task.status.state),
            cursor=number(task))
        return task.id, None, task.status.state in ENDED
    if kind == "status_update":
        update = response.status_update
        say(seen="status", state=TaskState.Name(update.status.state), seq=number(update))
        return update.task_id, number(update), update.status.state in ENDED
    if kind == "artifact_update":
        update = response.artifact_update
        text = "".join(p.text for p in update.artifact.parts)
        say(seen="artifact", artifact=update.artifact.artifact_id, text=text, append=update.append,
            last=update.last_chunk, seq=number(update))
        return update.task_id, number(update), False
    say(seen=kind)
    return None, None, False


def message(text, **ids):
    return SendMessageRequest(message=Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                                              parts=[Part(text=text)], **ids))


def answer(task):
    return "".join(p.text for a in task.artifacts for p in a.parts)


async def client_for(url, token, streaming=True, polling=False):
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    config = ClientConfig(httpx_client=http, streaming=streaming, polling=polling)
    return await create_client(url, client_config=config)


async def stream(url, token, leave_after):
    client = await client_for(url, token)
    task_id, last, ended = None, -1, False
    count = 0
    async for response in client.send_message(message("go")):
        task, n, ended = seen(response)
        task_id = task_id or task
        last = n if n is not None else last
        count += 1
        if ended or count == leave_after:
            break
    say(left_after=last)
    while not ended:
        await asyncio.sleep(1)
        context = ClientCallContext(service_parameters={"baton-starting-after": str(last)})
        say(back_after=last)
        async for response in client.subscribe(SubscribeToTaskRequest(id=task_id), context=context):
            _, n, ended = seen(response)
            last = n if n is not None else last
            if ended:
                break
    task = await client.get_task(GetTaskRequest(id=task_id))
    say(final=TaskState.Name(task.status.state), text=answer(task), task=task_id)


async def node(url, other_url, token):
    client = await client_for(url, token)
    task_id, last, ended = None, -1, False
    try:
        async for response in client.send_message(message("go")):
            task, n, ended = seen(response)
            task_id = task_id or task
            last = n if n is not None else last
            if ended:
                break
    except Exception as cut:  # the server pod went away mid-stream
        say(cut=type(cut).__name__, after=last)
    for _ in range(600):
        if ended:
            break
        try:
            other = await client_for(other_url, token)
            context = ClientCallContext(service_parameters={"baton-starting-after": str(last)})
            say(back_after=last)
            async for response in other.subscribe(SubscribeToTaskRequest(id=task_id), context=context):
                _, n, ended = seen(response)
                last = n if n is not None else last
                if ended:
                    break
        except Exception as cut:
            say(cut=type(cut).__name__, after=last)
            await asyncio.sleep(0.5)
    other = await client_for(other_url, token)
    task = await other.get_task(GetTaskRequest(id=task_id))
    say(final=TaskState.Name(task.status.state), text=answer(task), task=task_id)


async def resubscribe(url, token, task_id):
    client = await client_for(url, token)
    async for response in client.subscribe(SubscribeToTaskRequest(id=task_id)):
        _, _, ended = seen(response)
        if ended:
            break


async def conversation(url, token, turns):
    client = await client_for(url, token, streaming=False)
    for i in range(1, turns + 1):
        async for response in client.send_message(message(f"turn {i}")):
            task = response.task
            say(turn=i, task=task.id, context=task.context_id, state=TaskState.Name(task.status.state),
                text=answer(task))


async def cancel(url, token):
    client = await client_for(url, token, streaming=False, polling=True)
    async for response in client.send_message(message("never mind")):
        task = response.task
        say(created=task.id, state=TaskState.Name(task.status.state))
    cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
    say(cancel_answered=TaskState.Name(cancelled.status.state))
    for _ in range(120):
        task = await client.get_task(GetTaskRequest(id=task.id))
        if task.status.state in ENDED:
            break
        await asyncio.sleep(0.5)
    say(final=TaskState.Name(task.status.state))


def main():
    mode, url, token = sys.argv[1:4]
    if mode == "stream":
        asyncio.run(stream(url, token, int(sys.argv[4])))
    elif mode == "node":
        asyncio.run(node(url, sys.argv[3], sys.argv[4]))
    elif mode == "resubscribe":
        asyncio.run(resubscribe(url, token, sys.argv[4]))
    elif mode == "conversation":
        asyncio.run(conversation(url, token, int(sys.argv[4])))
    elif mode == "cancel":
        asyncio.run(cancel(url, token))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
