"""The HTTP layer: the Starlette app, its handlers, errors as responses, metrics, the server and CLI."""
