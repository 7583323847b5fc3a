"""OpenAI's Batch API: files of requests run on the capacity interactive traffic leaves (see
services.py for the shape, dispatcher.py for how lines are sent)."""
