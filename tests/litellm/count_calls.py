"""A LiteLLM callback that counts, at the model server, the model calls that completed: one JSON
line a call, {"model": ..., "stream": ...}, appended to the file named by BATON_MODEL_CALLS_FILE
(nothing is written when it is unset). A test reads it to learn how often the model really
answered, whatever the agent or baton's gateway say (a replayed call never reaches the model).

tests/litellm/counted.yaml loads it: LiteLLM's proxy resolves `count_calls.handler` in the
config file's own directory and wants an instance of CustomLogger there, not the class.
"""

import json
import os
import threading

from litellm.integrations.custom_logger import CustomLogger


class CountCalls(CustomLogger):
    def __init__(self):
        super().__init__()
        # The sync hook may run on the proxy's worker threads: one line at a time.
        self._lock = threading.Lock()

    def _record(self, kwargs):
        path = os.environ.get("BATON_MODEL_CALLS_FILE")
        if not path:
            return
        payload = kwargs.get("standard_logging_object") or {}
        # The model group is the name the client asked for (mock-gpt), not the model behind it.
        model = payload.get("model_group") or kwargs.get("model")
        stream = bool(payload.get("stream", kwargs.get("stream")))
        line = json.dumps({"model": model, "stream": stream}) + "\n"
        with self._lock, open(path, "a", encoding="utf-8") as f:
            # Flushed line by line, so a test sees each call as soon as it completed, even one
            # made just before the pod that made it was killed.
            f.write(line)
            f.flush()

    # LiteLLM calls one of the two for each completed call: the sync hook for a sync request,
    # the async one for an async request (all of the proxy's); for a streamed call, once, when
    # the stream is complete.
    def log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._record(kwargs)

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):
        self._record(kwargs)


handler = CountCalls()
