"""The replica process: one engine behind a Redis request stream (see server.py).

`protocol` is torch-free and shared with the gateway; importing this package loads nothing else.
"""
