"""Errors a request can end with, each mapped to TGI's HTTP status and `error_type`.

Clients (TGI's own `text-generation` package among them) dispatch on the status code and on
`error_type`, so both must match TGI exactly. Every body also carries the request's id, the one
the router's log uses for it: an internal failure (a shard's exception, a router bug) reaches the
client as a short, stable message, and its detail is in the log under that id.
"""

from __future__ import annotations


class RouterError(Exception):
    """Base of every error that is answered as `{"error": ..., "error_type": ...}`."""

    status: int = 500
    error_type: str = "internal"

    @property
    def message(self) -> str:
        return str(self)

    def to_json(self, request_id: str) -> dict[str, str]:
        """The one shape of every error body, streamed or not."""
        return {"error": self.message, "error_type": self.error_type, "request_id": request_id}


class ValidationError(RouterError):
    """The request can never succeed as given (422)."""

    status = 422
    error_type = "validation"

    @property
    def message(self) -> str:
        return f"Input validation error: {self}"


class ModelNotFoundError(RouterError):
    """OpenAI's `model` names neither the served model nor a loaded LoRA adapter (404, as vLLM)."""

    status = 404
    error_type = "model_not_found"

    def __init__(self, model: str, available: list[str]) -> None:
        super().__init__(
            f"The model `{model}` does not exist. Available models: {', '.join(available)}"
        )
        self.model = model


class AdapterRequestError(RouterError):
    """A refused /v1/load_lora_adapter or /v1/unload_lora_adapter request (400, as vLLM): a bad
    name or path, a name in use, or an adapter the shards refused (their reason verbatim)."""

    status = 400
    error_type = "invalid_lora_adapter"


class AdapterNotFoundError(RouterError):
    """/v1/unload_lora_adapter names no loaded adapter (404, vLLM's NotFoundError)."""

    status = 404
    error_type = "adapter_not_found"

    def __init__(self, name: str, loaded: list[str]) -> None:
        super().__init__(
            f"The LoRA adapter {name!r} cannot be found. Loaded: {', '.join(loaded) or 'none'}"
        )


class RuntimeLoadingOffError(RouterError):
    """The runtime adapter routes without --enable-lora-runtime-loading (404: vLLM does not
    register them without VLLM_ALLOW_RUNTIME_LORA_UPDATING; ours also say how to turn them on)."""

    status = 404
    error_type = "not_found"

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} is off: start the server with --enable-lora-runtime-loading and --lora-dir"
        )


class OverloadedError(RouterError):
    """Too many requests in flight (429); the client may retry later."""

    status = 429
    error_type = "overloaded"

    def __init__(self) -> None:
        super().__init__("Model is overloaded")


class GenerationError(RouterError):
    """A shard failed while running this request's batch (424).

    The message is written for clients; what went wrong inside is logged with the request id.
    """

    status = 424
    error_type = "generation"

    @property
    def message(self) -> str:
        return f"Request failed during generation: {self}"


class IncompleteGenerationError(RouterError):
    """The generation stopped without a final token (500), e.g. the router shut down."""

    status = 500
    error_type = "incomplete_generation"

    def __init__(self) -> None:
        super().__init__("Incomplete generation")


class UnhealthyError(RouterError):
    status = 503
    error_type = "healthcheck"

    def __init__(self, reason: str = "unhealthy") -> None:
        super().__init__(reason)


class ServerStoppingError(RouterError):
    """The shards can no longer serve (one hung, or stopped itself): the router is stopping, and
    the launcher will restart nothing; the orchestrator restarts the pod."""

    status = 503
    error_type = "unavailable"


class UnauthorizedError(RouterError):
    """--api-key is set and the request does not carry it (401)."""

    status = 401
    error_type = "unauthorized"

    def __init__(self) -> None:
        super().__init__("Unauthorized: send `Authorization: Bearer <api key>`")


class PayloadTooLargeError(RouterError):
    """The body exceeds --payload-limit (413), refused before it is parsed."""

    status = 413
    error_type = "payload_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"Payload too large: the request body exceeds {limit} bytes (--payload-limit)"
        )


class HeaderTooLargeError(RouterError):
    """A request line or header past --max-header-size bytes, or more header fields than
    --max-headers (431, RFC 6585), refused by the HTTP parser before any route runs."""

    status = 431
    error_type = "header_too_large"


class UnsupportedMediaTypeError(RouterError):
    """A JSON route got a body that is not declared as JSON (415), as TGI's axum answers."""

    status = 415
    error_type = "unsupported_media_type"

    def __init__(self, content_type: str | None) -> None:
        given = content_type or "no Content-Type"
        super().__init__(f"Content-Type must be application/json. Given: {given}")


class HttpError(RouterError):
    """aiohttp's own refusals (404, 405...), with their status and reason."""

    error_type = "http"

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class InternalError(RouterError):
    """An unexpected exception in a handler (500): only the request id reaches the client."""

    status = 500
    error_type = "internal"

    def __init__(self) -> None:
        super().__init__("Internal server error; the server log has the details")


class CorsRefusedError(RouterError):
    """A CORS preflight from an origin --cors-allow-origin does not list (403)."""

    status = 403
    error_type = "cors"

    def __init__(self) -> None:
        super().__init__("origin not allowed (--cors-allow-origin)")


def internal_failure(cause: BaseException) -> GenerationError:
    """What a client learns of an internal failure: which step failed where, if that is known
    (`summary` of router.client.ShardError and ShardDivergenceError), never the raw text."""
    summary = getattr(cause, "summary", None) or "internal error"
    return GenerationError(f"{summary} (the server log has the details under this request_id)")
