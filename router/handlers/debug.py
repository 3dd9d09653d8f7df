"""GET /debug/steps: the scheduler's step timeline (router/step_trace.py) as JSON, for
benchmarks and profiling. `?since=N` returns the steps from number N on (the answer's `next` is
where the following call should start)."""

from __future__ import annotations

from aiohttp import web

from router.errors import ValidationError
from router.handlers.common import infer_of


async def debug_steps(request: web.Request) -> web.Response:
    raw = request.query.get("since", "0")
    if not raw.isdigit():
        raise ValidationError(f"`since` must be a step number (an integer >= 0), got {raw!r}")
    return web.json_response(infer_of(request).batcher.trace.snapshot(int(raw)))
