"""Wire schemas: the OpenAI and vLLM request/response bodies, named as vLLM's contract names them."""
