"""The HTTP APIs' request bodies: one pydantic declaration per field (type, limits, how errors
about it read), from which both the parsing and GET /openapi.json are generated.

`tgi.py` and `openai.py` each parse their own bodies into the one shared
`router.request.GenerationRequest`; `router/validation.py` then checks it against the server's
limits, once, whatever API it came through.
"""
