"""A seeded, generated corpus of short agent-style chats for the demo model.

Two kinds of conversation, drawn from small fact tables so that a model of a few million
parameters can learn them in minutes:
- questions answered in one short sentence ("What is the capital of Japan?" → "Tokyo.");
- requests that need a tool, answered with a JSON tool call between `<tool_call>` tags, then
  (after the tool's result) a one-sentence answer built from that result.

Conversations are OpenAI-style message lists; the chat template (chat_template.jinja) turns
them into text. Nothing here is random without the seed.
"""

from __future__ import annotations

import json
import random

CITIES = {
    "Paris": ("France", "Europe/Paris"),
    "Tokyo": ("Japan", "Asia/Tokyo"),
    "Berlin": ("Germany", "Europe/Berlin"),
    "Madrid": ("Spain", "Europe/Madrid"),
    "Rome": ("Italy", "Europe/Rome"),
    "Lisbon": ("Portugal", "Europe/Lisbon"),
    "Cairo": ("Egypt", "Africa/Cairo"),
    "Nairobi": ("Kenya", "Africa/Nairobi"),
    "Ottawa": ("Canada", "America/Toronto"),
    "Lima": ("Peru", "America/Lima"),
    "Seoul": ("Korea", "Asia/Seoul"),
    "Oslo": ("Norway", "Europe/Oslo"),
    "Dublin": ("Ireland", "Europe/Dublin"),
    "Vienna": ("Austria", "Europe/Vienna"),
    "Warsaw": ("Poland", "Europe/Warsaw"),
    "Athens": ("Greece", "Europe/Athens"),
    "Hanoi": ("Vietnam", "Asia/Bangkok"),
    "Delhi": ("India", "Asia/Kolkata"),
    "Canberra": ("Australia", "Australia/Sydney"),
    "Santiago": ("Chile", "America/Santiago"),
}
CURRENCIES = ["USD", "EUR", "JPY", "GBP", "CHF", "CAD", "INR", "AUD"]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]
PRIORITIES = ["low", "normal", "high"]
TOPICS = ["billing", "login", "latency", "quota", "deployment", "api keys", "streaming", "caching"]

FACTS = [
    ("What is Switchyard?", "Switchyard is a platform that serves language models on GPU machines."),
    ("Who are you?", "I am a small demo model served by Switchyard."),
    ("What can you do?", "I answer short questions and call tools."),
    ("What is prefix caching?", "Prefix caching reuses the KV cache of a prompt that was seen before."),
    ("What is a token?", "A token is a piece of text that the model reads or writes."),
    ("What is speculative decoding?", "A small draft proposes tokens and the model checks them in one step."),
    ("What is a KV cache?", "The KV cache keeps the keys and values of past tokens."),
    ("What does prefill mean?", "Prefill is the step that reads the whole prompt."),
    ("What does decode mean?", "Decode is the step that writes one token at a time."),
    ("Say hello.", "Hello!"),
    ("Thank you!", "You are welcome."),
    ("How are you?", "I am fine, thank you."),
]
GREETINGS = ["", "Hi! ", "Hello. ", "Please tell me: ", "Quick question: "]
NO_TOOL_ANSWER = "I need a tool for that, and none is available."


def tool_schemas() -> list[dict]:
    """The OpenAI `tools` list the demo model was trained with."""

    def fn(name: str, description: str, **props: str) -> dict:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {k: {"type": v} for k, v in props.items()},
                    "required": list(props),
                },
            },
        }

    return [
        fn("get_weather", "Current weather in a city", city="string"),
        fn("get_time", "Local time in a city", city="string"),
        fn("convert_currency", "Convert an amount of money", amount="number", source="string", target="string"),
        fn("create_ticket", "Open a support ticket", topic="string", priority="string"),
        fn("search_docs", "Search the documentation", query="string"),
    ]


def _tool_call(name: str, arguments: dict) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _fact_chat(rng: random.Random) -> list[dict]:
    kind = rng.random()
    if kind < 0.45:
        city = rng.choice(list(CITIES))
        country = CITIES[city][0]
        q = rng.choice(["What is the capital of {c}?", "Which city is the capital of {c}?", "Capital of {c}?"])
        return [
            {"role": "user", "content": rng.choice(GREETINGS) + q.format(c=country)},
            {"role": "assistant", "content": f"The capital of {country} is {city}."},
        ]
    if kind < 0.7:
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        op = rng.choice(["+", "-"])
        result = a + b if op == "+" else a - b
        return [
            {"role": "user", "content": f"What is {a} {op} {b}?"},
            {"role": "assistant", "content": f"{a} {op} {b} = {result}."},
        ]
    question, answer = rng.choice(FACTS)
    return [
        {"role": "user", "content": rng.choice(GREETINGS) + question},
        {"role": "assistant", "content": answer},
    ]


def _tool_chat(rng: random.Random) -> list[dict]:
    kind = rng.randrange(5)
    if kind == 0:
        city = rng.choice(list(CITIES))
        ask = rng.choice(["What is the weather in {c}?", "Is it raining in {c}?", "Weather in {c} please."])
        call = _tool_call("get_weather", {"city": city})
        temp, cond = rng.randint(-5, 35), rng.choice(CONDITIONS)
        result = {"city": city, "temperature_c": temp, "condition": cond}
        final = f"It is {temp} degrees and {cond} in {city}."
    elif kind == 1:
        city = rng.choice(list(CITIES))
        ask = rng.choice(["What time is it in {c}?", "Local time in {c}?", "Tell me the time in {c}."])
        call = _tool_call("get_time", {"city": city})
        hh, mm = rng.randint(0, 23), rng.randint(0, 59)
        result = {"city": city, "time": f"{hh:02d}:{mm:02d}"}
        final = f"It is {hh:02d}:{mm:02d} in {city}."
    elif kind == 2:
        amount = rng.choice([5, 10, 20, 50, 100, 250, 1000])
        src, dst = rng.sample(CURRENCIES, 2)
        ask = rng.choice(["Convert {a} {s} to {t}.", "How much is {a} {s} in {t}?"]).format(a=amount, s=src, t=dst)
        call = _tool_call("convert_currency", {"amount": amount, "source": src, "target": dst})
        value = round(amount * rng.uniform(0.2, 3.0), 2)
        result = {"amount": value, "currency": dst}
        final = f"{amount} {src} is {value} {dst}."
        city = None
    elif kind == 3:
        topic, prio = rng.choice(TOPICS), rng.choice(PRIORITIES)
        ask = f"Open a {prio} priority ticket about {topic}."
        call = _tool_call("create_ticket", {"topic": topic, "priority": prio})
        number = rng.randint(100, 999)
        result = {"ticket": number, "status": "open"}
        final = f"Ticket {number} is open."
        city = None
    else:
        topic = rng.choice(TOPICS)
        ask = rng.choice(["Search the docs for {q}.", "Find documentation about {q}."]).format(q=topic)
        call = _tool_call("search_docs", {"query": topic})
        result = {"title": f"Guide to {topic}", "url": f"/docs/{topic.replace(' ', '-')}"}
        final = f"See the guide to {topic}."
        city = None
    if city is not None:
        ask = ask.format(c=city)
    return [
        {"role": "user", "content": rng.choice(GREETINGS) + ask},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": json.dumps(result)},
        {"role": "assistant", "content": final},
    ]


def conversations(n: int, seed: int = 0) -> list[tuple[list[dict], list[dict] | None]]:
    """`n` (messages, tools) pairs. Tool chats carry the tools (some are asked without them and
    answered so); a third of the plain questions carry them too, so that the model learns to
    answer without calling one."""
    rng = random.Random(seed)
    tools = tool_schemas()
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            chat = _tool_chat(rng)
            if rng.random() < 0.15:  # asked without tools: say so rather than invent a call
                out.append(([chat[0], {"role": "assistant", "content": NO_TOOL_ANSWER}], None))
            else:
                out.append((chat, tools))
        else:
            out.append((_fact_chat(rng), tools if rng.random() < 0.33 else None))
    return out
