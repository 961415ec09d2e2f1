"""The stock `openai` SDK against baton's Responses API, unchanged: only its base_url (baton
server's namespace) and api_key (the caller's Kubernetes token) are baton's. Prints one JSON
line per thing seen, for the test to check.

    responses_client.py stream BASE_URL TOKEN MODEL LEAVE_AFTER
        create(background, stream); leave after LEAVE_AFTER events; come back with
        retrieve(stream, starting_after) until the end; then retrieve the object.
    responses_client.py node BASE_URL OTHER_URL TOKEN MODEL
        create(background, stream) through BASE_URL; whenever the stream is cut (its server
        gone), come back through OTHER_URL with retrieve(stream, starting_after) until the end.
    responses_client.py conversation BASE_URL TOKEN THREAD TURNS
        TURNS blocking creates in the thread's conversation; then the conversation retrieved
        and its items listed, oldest first, two a page.
    responses_client.py created BASE_URL TOKEN TEMPLATE
        a conversation created with TEMPLATE's agent, one blocking turn in it, that turn's
        input items, then the conversation deleted.
    responses_client.py cancel BASE_URL TOKEN MODEL
        create(background), cancel it, retrieve until it has ended.
"""

import json
import sys
import time

from openai import OpenAI

ENDS = ("response.completed", "response.failed", "response.cancelled", "response.incomplete")


def say(**fields):
    print(json.dumps(fields), flush=True)


def seen(event):
    """One event, as the test checks it."""
    fields = {"seen": event.type, "seq": event.sequence_number}
    if event.type in ENDS:
        fields["status"] = event.response.status
        fields["text"] = event.response.output_text
    if event.type == "response.output_text.delta":
        fields["delta"] = event.delta
    say(**fields)


def stream(client, model, leave_after):
    events = client.responses.create(model=model, input="go", background=True, stream=True)
    response_id, last = None, None
    for i, event in enumerate(events):
        if event.type == "response.created":
            response_id = event.response.id
            say(created=response_id, status=event.response.status)
        seen(event)
        last = event.sequence_number
        if event.type in ENDS:
            break
        if i + 1 == leave_after:
            events.close()
            say(left_after=last)
            break
    ended = False
    while not ended:
        time.sleep(1)
        again = client.responses.retrieve(response_id, stream=True, starting_after=last)
        say(back_after=last)
        for event in again:
            seen(event)
            last = event.sequence_number
            if event.type in ENDS:
                ended = True
                break
    final = client.responses.retrieve(response_id)
    say(final=final.status, text=final.output_text, items=len(final.output))


def follow(events, last):
    """Reads `events` until the end; (last number, ended). A cut stream raises."""
    for event in events:
        seen(event)
        last = event.sequence_number
        if event.type in ENDS:
            return last, True
    return last, False


def node(client, other, model):
    events = client.responses.create(model=model, input="go", background=True, stream=True)
    response_id, last, ended = None, None, False
    try:
        for event in events:
            if event.type == "response.created":
                response_id = event.response.id
                say(created=response_id, status=event.response.status)
            seen(event)
            last = event.sequence_number
            if event.type in ENDS:
                ended = True
                break
    except Exception as cut:  # the server pod went away mid-stream
        say(cut=type(cut).__name__, after=last)
    for _ in range(600):
        if ended:
            break
        try:
            again = other.responses.retrieve(response_id, stream=True, starting_after=last)
            say(back_after=last)
            last, ended = follow(again, last)
        except Exception as cut:
            say(cut=type(cut).__name__, after=last)
            time.sleep(0.5)
    final = other.responses.retrieve(response_id)
    say(final=final.status, text=final.output_text, items=len(final.output))


def conversation(client, thread, turns):
    for i in range(1, turns + 1):
        response = client.responses.create(conversation=thread, input=f"turn {i}")
        say(turn=i, id=response.id, status=response.status, text=response.output_text,
            conversation=response.conversation.id if response.conversation else None)


def text_of(item):
    content = getattr(item, "content", None) or []
    return content[0].text if content else None


def items_of(client, conversation_id):
    """Every item, the SDK's pager asking for each page after the last id it got."""
    pages = client.conversations.items.list(conversation_id, order="asc", limit=2)
    return [[item.type, getattr(item, "role", None), text_of(item), item.id] for item in pages]


def listed(client, thread):
    got = client.conversations.retrieve(thread)
    say(object=got.object, conversation_id=got.id, items=items_of(client, thread))


def created(client, template):
    conversation = client.conversations.create(metadata={"agent": f"thread/{template}", "topic": "bed"})
    say(created=conversation.id, metadata=conversation.metadata)
    response = client.responses.create(conversation=conversation.id, input="hello")
    say(turn=response.id, status=response.status, text=response.output_text)
    inputs = client.responses.input_items.list(response.id)
    say(inputs=[text_of(item) for item in inputs])
    listed(client, conversation.id)
    deleted = client.conversations.delete(conversation.id)
    say(deleted=deleted.deleted, id=deleted.id)


def cancel(client, model):
    response = client.responses.create(model=model, input="never mind", background=True)
    say(created=response.id, status=response.status)
    cancelled = client.responses.cancel(response.id)
    say(cancel_answered=cancelled.status)
    for _ in range(120):
        response = client.responses.retrieve(response.id)
        if response.status not in ("queued", "in_progress"):
            break
        time.sleep(0.5)
    say(final=response.status)


def main():
    mode, base_url, token = sys.argv[1:4]
    if mode == "node":
        other_url, token = sys.argv[3:5]
        client = OpenAI(base_url=base_url, api_key=token, max_retries=0)
        other = OpenAI(base_url=other_url, api_key=token, max_retries=0)
        return node(client, other, sys.argv[5])
    client = OpenAI(base_url=base_url, api_key=token, max_retries=0)
    if mode == "stream":
        stream(client, sys.argv[4], int(sys.argv[5]))
    elif mode == "conversation":
        conversation(client, sys.argv[4], int(sys.argv[5]))
        listed(client, sys.argv[4])
    elif mode == "created":
        created(client, sys.argv[4])
    elif mode == "cancel":
        cancel(client, sys.argv[4])
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
