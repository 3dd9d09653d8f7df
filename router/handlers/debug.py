"""GET /debug/steps: the scheduler's step timeline (router/step_trace.py) as JSON, for
benchmarks and profiling. `?since=N` returns the steps from number N on (the answer's `next` is
where the following call should start)."""

from __future__ import annotations

from aiohttp import web

from router.errors import ValidationError
from router.handlers.common import infer_of

# Step numbers are counted from 0 by one process: 64 bits never run out.
MAX_STEP = 2**63 - 1


async def debug_steps(request: web.Request) -> web.Response:
    raw = request.query.get("since", "0")
    # ASCII only: str.isdigit() takes digits (such as "²") that int() refuses; a long run of
    # digits is refused before int() (Python converts at most 4300 digits).
    digits = raw.isascii() and raw.isdigit() and len(raw) <= len(str(MAX_STEP))
    if not (digits and int(raw) <= MAX_STEP):
        shown = raw if len(raw) <= 32 else f"{raw[:32]}..."
        raise ValidationError(
            f"`since` must be a step number (an integer >= 0 and <= {MAX_STEP}), got {shown!r}"
        )
    return web.json_response(infer_of(request).batcher.trace.snapshot(int(raw)))
