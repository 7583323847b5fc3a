"""The APIs the gateway speaks, each a thin adapter over core/ and http.py: a `request.py` that
parses its bodies into a GenerationRequest (Responses, Messages and tokenize lower theirs to
OpenAI's chat, openai/request.py) and a `views.py` that shapes replica deltas into its answers."""
