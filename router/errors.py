"""Errors a request can end with, each mapped to TGI's HTTP status and `error_type`.

Clients (TGI's own `text-generation` package among them) dispatch on the status code and on
`error_type`, so both must match TGI exactly.
"""

from __future__ import annotations


class RouterError(Exception):
    """Base of every error that is answered as `{"error": ..., "error_type": ...}`."""

    status: int = 500
    error_type: str = "internal"

    @property
    def message(self) -> str:
        return str(self)

    def to_json(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.error_type}


class ValidationError(RouterError):
    """The request can never succeed as given (422)."""

    status = 422
    error_type = "validation"

    @property
    def message(self) -> str:
        return f"Input validation error: {self}"


class OverloadedError(RouterError):
    """Too many requests in flight (429); the client may retry later."""

    status = 429
    error_type = "overloaded"

    def __init__(self) -> None:
        super().__init__("Model is overloaded")


class GenerationError(RouterError):
    """A shard failed while running this request's batch (424)."""

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

    def __init__(self) -> None:
        super().__init__("unhealthy")


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
