"""What every API dialect of the gateway shares: the validated request, the error, the JSON body
and the checks. A dialect (OpenAI, Responses, Anthropic, tokenize) parses its own shape into these
and renders them back; nothing here knows any dialect's wire format."""
