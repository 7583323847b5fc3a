"""A seeded, generated corpus of short agent-style chats for the demo model.

Two kinds of conversation, drawn from small fact tables so that a model of a few million
parameters can learn them in minutes:
- questions answered in one short sentence ("What is the capital of Japan?" → "Tokyo.");
- requests that need a tool, answered with a JSON tool call between `<tool_call>` tags, then
  (after the tool's result) a one-sentence answer built from that result.

Callers offer whatever tools they like, so each chat offers a random subset of the demo's five
tools in a random order, often beside made-up tools the demo model knows nothing of. A request
whose tool is offered gets the call; one whose tool is not gets a sentence saying so, never a
call to a tool that was not offered.

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
MISSING_TOOL_ANSWER = "I need a tool for that, and none of these tools can do it."


def tool_schema(name: str, description: str, **props: str) -> dict:
    """One OpenAI `tools` entry: a function taking the named (required) properties."""
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


def tool_schemas() -> list[dict]:
    """The OpenAI `tools` list of every tool the demo model knows how to call."""
    fn = tool_schema
    return [
        fn("get_weather", "Current weather in a city", city="string"),
        fn("get_time", "Local time in a city", city="string"),
        fn("convert_currency", "Convert an amount of money", amount="number", source="string", target="string"),
        fn("create_ticket", "Open a support ticket", topic="string", priority="string"),
        fn("search_docs", "Search the documentation", query="string"),
    ]


# Tools the demo model never calls, made up from these words: offered beside its own, so that
# it learns to pick a tool by its name, whatever else is on the list.
DECOY_VERBS = ["send", "list", "find", "book", "play", "check", "delete", "update", "cancel", "start", "read"]
DECOY_NOUNS = ["email", "stock_price", "flight", "alarm", "song", "news", "invoice", "contact", "file", "recipe"]
DECOY_ARGS = ["to", "subject", "symbol", "text", "language", "origin", "date", "song", "id", "title", "city", "query"]


def decoy_tools(rng: random.Random, k: int) -> list[dict]:
    """`k` distinct made-up tools, none of them the demo's."""
    names = rng.sample([f"{v}_{n}" for v in DECOY_VERBS for n in DECOY_NOUNS], k)
    return [
        tool_schema(name, "", **dict.fromkeys(rng.sample(DECOY_ARGS, rng.randint(1, 2)), "string")) for name in names
    ]


def offered_tools(rng: random.Random, needed: str | None = None, has_needed: bool = True) -> list[dict]:
    """A non-empty, shuffled mix of some of the demo's tools and up to two decoys. With `needed`,
    the mix holds that tool if `has_needed`, and not otherwise; either way, it usually holds
    one to four of the demo's tools, so that only the needed tool's name, not how many of the
    demo's tools there are, tells a call from a refusal."""
    own = [t for t in tool_schemas() if t["function"]["name"] != needed]
    mine = [t for t in tool_schemas() if t["function"]["name"] == needed]
    count = (
        rng.choice([0, 1, 2, 3, 4, 5])
        if needed is None
        else rng.choice([1, 1, 2, 2, 3, 3, 4, 4, 5 if has_needed else 0])
    )
    if needed is None or not has_needed:
        picked = rng.sample(own, min(count, len(own)))
    else:
        picked = mine + rng.sample(own, max(count - 1, 0))
    picked += decoy_tools(rng, rng.choice([0, 0, 1, 2]))
    rng.shuffle(picked)
    return picked or decoy_tools(rng, 1)


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
    """`n` (messages, tools) pairs. Most tool chats are offered their tool among others; some
    are offered no tools, or tools that cannot do the job, and answered so rather than with an
    invented call. A third of the plain questions are offered tools too, so that the model
    learns to answer without calling one."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            chat = _tool_chat(rng)
            needed = chat[1]["tool_calls"][0]["function"]["name"]
            kind = rng.random()
            if kind < 0.1:
                out.append(([chat[0], {"role": "assistant", "content": NO_TOOL_ANSWER}], None))
            elif kind < 0.4:
                tools = offered_tools(rng, needed, has_needed=False)
                out.append(([chat[0], {"role": "assistant", "content": MISSING_TOOL_ANSWER}], tools))
            else:
                out.append((chat, offered_tools(rng, needed)))
        else:
            out.append((_fact_chat(rng), offered_tools(rng) if rng.random() < 0.33 else None))
    return out
