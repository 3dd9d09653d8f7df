"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's routes; router/lora_runtime.py).

They always exist, so that a client gets a 404 that names the flag rather than a bare "Not
Found" when runtime loading is off. Success is vLLM's answer, a 200 with a line of text; every
refusal is the usual JSON error body.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from aiohttp import web

from router.api.lora import LoadLoraAdapter, UnloadLoraAdapter
from router.errors import AdapterRequestError, RuntimeLoadingOffError
from router.handlers.common import infer_of, read_json
from router.lora_runtime import LoraRuntime


def _runtime(request: web.Request) -> LoraRuntime:
    runtime = infer_of(request).lora_runtime
    if runtime is None:
        raise RuntimeLoadingOffError(request.path)
    return runtime


async def _body(request: web.Request, fields: Collection[str]) -> dict[str, Any]:
    payload = await read_json(request)
    unknown = sorted(set(payload) - set(fields))
    if unknown:
        raise AdapterRequestError(f"unknown field(s) {unknown}; expected {sorted(fields)}")
    return payload


async def load_lora_adapter(request: web.Request) -> web.Response:
    runtime = _runtime(request)
    payload = await _body(request, LoadLoraAdapter.model_fields)
    adapter = await runtime.load(payload.get("lora_name"), payload.get("lora_path"))
    return web.Response(text=f"Success: LoRA adapter '{adapter.name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    runtime = _runtime(request)
    payload = await _body(request, UnloadLoraAdapter.model_fields)
    name = payload.get("lora_name")
    await runtime.unload(name)
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
