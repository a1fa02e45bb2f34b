"""Anthropic Messages and OpenAI Responses as chat: the conversions and checks vLLM 0.33 makes.

Shared by render (a Messages or Responses request renders as the chat request it converts to)
and derender (whose parse options come from that chat request); uses only ``model`` and
``protocol``.
"""
