"""The demo model Switchyard ships: a small Llama trained here from a generated corpus of
agent-style chats (corpus.py, train.py). `MODEL_DIR` is the committed Hugging Face directory."""

from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent / "model"
