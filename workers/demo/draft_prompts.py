"""Prompts for training the demo model's EAGLE-3 draft head:

    python -m workers.demo.draft_prompts --out FILE [--n 2500]

The chats the demo model was trained on (corpus.py, seed 0), cut before each assistant turn:
a user's question (answered with a sentence or a tool call) and, after a tool call, the tool's
result (answered with a sentence). One JSON line each, {"messages": [...], "tools": [...]}, the
format `python -m workers.draft_training.train_eagle3 --data` reads; the target writes the answers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workers.demo.corpus import conversations


def prompts(n: int, seed: int = 0) -> list[dict]:
    rows = []
    for messages, tools in conversations(n, seed=seed):
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                rows.append({"messages": messages[:i], "tools": tools})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.demo.draft_prompts", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=2500, help="chats to draw (each gives one or two prompts)")
    args = parser.parse_args(argv)
    rows = prompts(args.n)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} prompts from {args.n} chats -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
