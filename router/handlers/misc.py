"""GET /info, /health, /metrics, /v1/models, /openapi.json, POST /tokenize and TGI's compat
route POST /."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

import router
from router.api.parsing import parse
from router.api.tgi import GenerateRequest, TokenizeRequest, to_request
from router.errors import UnhealthyError
from router.handlers.common import error_response, infer_of, read_json
from router.handlers.generate import generate_request
from router.handlers.stream import stream_request
from router.metrics import CONTENT_TYPE


async def info(request: web.Request) -> web.Response:
    infer = infer_of(request)
    args, limits, model = infer.args, infer.limits, infer.model
    body: dict[str, Any] = {
        "model_id": model.model_id,
        "model_sha": None,
        "model_dtype": model.dtype,
        "model_device_type": model.device_type,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": args.max_concurrent_requests,
        "max_best_of": args.max_best_of,
        "max_stop_sequences": args.max_stop_sequences,
        "max_input_tokens": limits.max_input_tokens,
        "max_input_length": limits.max_input_tokens,  # older TGI name, still read by clients
        "max_total_tokens": limits.max_total_tokens,
        "max_batch_prefill_tokens": limits.max_batch_prefill_tokens,
        "prefill_chunking": args.prefill_chunking,
        "prefill_chunk_tokens": limits.prefill_chunk_tokens,
        "prefix_caching": args.prefix_caching,
        "max_batch_total_tokens": limits.batch_total_tokens,
        "max_supported_total_tokens": limits.max_supported_total_tokens,
        "waiting_served_ratio": args.waiting_served_ratio,
        "max_waiting_tokens": args.max_waiting_tokens,
        "max_batch_size": args.max_batch_size,
        "max_top_n_tokens": args.max_top_n_tokens,
        # TGI's field: tokens proposed per step by speculative decoding (0: off).
        "speculate": spec.num_speculative_tokens if (spec := args.speculative_config) else 0,
        "lora_adapters": infer.adapters.names,
        "max_loras": args.max_loras,
        "max_client_batch_size": 1,
        "validation_workers": 1,
        "block_size": limits.block_size,
        "num_blocks": limits.num_blocks,
        "num_shard": model.world_size,
        "router": "switchyard",
        "version": router.__version__,
        "sha": None,
        "docker_label": None,
    }
    return web.json_response(body)


OPENAPI: web.AppKey[dict[str, Any]] = web.AppKey("openapi", dict)


async def openapi_json(request: web.Request) -> web.Response:
    """The OpenAPI document, built once from the route table when the app is created."""
    return web.json_response(request.app[OPENAPI])


async def health(request: web.Request) -> web.Response:
    infer = infer_of(request)
    if await infer.healthy():
        return web.Response(status=200)
    return error_response(request, UnhealthyError(infer.failure or "unhealthy"))


async def metrics(request: web.Request) -> web.Response:
    body = infer_of(request).metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def models(request: web.Request) -> web.Response:
    """OpenAI's GET /v1/models: the base model, then every LoRA adapter with its `parent` (the
    base model) and `root` (where it was loaded from), as vLLM lists them."""
    infer = infer_of(request)
    base = infer.model.model_id

    def entry(name: str, root: str, parent: str | None) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": infer.started_at,
            "owned_by": "switchyard",
            "root": root,
            "parent": parent,
        }

    data = [entry(base, base, None)]
    data += [entry(a.name, a.path, base) for a in infer.adapters.adapters]
    return web.json_response({"object": "list", "data": data})


async def tokenize(request: web.Request) -> web.Response:
    """TGI's /tokenize: the tokens of `inputs` with their character offsets."""
    infer = infer_of(request)
    body = parse(TokenizeRequest, await read_json(request))
    inputs = body.inputs
    encoding = await infer.tokenizer.encode(inputs, add_special_tokens=body.add_special_tokens)
    return web.json_response(
        [
            {"id": tid, "text": inputs[start:stop], "start": start, "stop": stop}
            for tid, (start, stop) in zip(encoding.ids, encoding.offsets, strict=True)
        ]
    )


async def compat_generate(request: web.Request) -> web.StreamResponse:
    """POST /: `stream` picks /generate_stream or /generate (answered as a one-element list)."""
    received = time.monotonic()
    body = parse(GenerateRequest, await read_json(request))
    if body.stream:
        return await stream_request(request, to_request(body, stream=True), received)
    generation = to_request(body, stream=False)
    return await generate_request(request, generation, as_list=True, received=received)
