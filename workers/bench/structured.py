"""Structured output benchmark: decode tokens/s of the demo model with and without a JSON-schema
constraint, at batch 1 and 8, and the share of constrained answers that validate.

SCHEMAS are twenty JSON schemas of varied shape (also the serving tests'): small enough (bounded
strings, numbers and arrays) that even the tiny demo model finishes each answer.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import jsonschema
import torch

from workers.bench.processes import ROOT

NAME = {"type": "string", "maxLength": 10}
AGE = {"type": "integer", "minimum": 0, "maximum": 120}


def obj(properties: dict, required=None) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


SCHEMAS = [
    obj({"name": NAME}),
    obj({"age": AGE}),
    obj({"color": {"type": "string", "enum": ["red", "green", "blue"]}}),
    obj({"ok": {"type": "boolean"}}),
    obj({"score": {"type": "number", "minimum": 0, "maximum": 10}}),
    obj({"ids": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 99}, "maxItems": 3}}),
    obj({"person": obj({"name": NAME, "age": AGE})}),
    obj({"people": {"type": "array", "items": obj({"name": NAME}), "minItems": 1, "maxItems": 2}}),
    obj({"value": {"enum": ["a", 1, None, True]}}),
    obj({"kind": {"const": "point"}, "x": {"type": "integer", "minimum": -5, "maximum": 5}}),
    obj({"either": {"anyOf": [NAME, AGE]}}),
    obj({"nick": {"type": ["string", "null"], "maxLength": 8}}),
    obj({"name": NAME, "age": AGE}, required=["name"]),
    {"type": "array", "items": {"enum": ["yes", "no"]}, "minItems": 1, "maxItems": 2},
    {"type": "string", "pattern": "^[a-z]{3}$"},
    {"type": "integer", "minimum": 10, "maximum": 20},
    obj({"title": NAME, "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}}),
    {
        "$defs": {"city": obj({"city": NAME})},
        "type": "object",
        "properties": {"home": {"$ref": "#/$defs/city"}, "work": {"$ref": "#/$defs/city"}},
        "required": ["home", "work"],
        "additionalProperties": False,
    },
    obj({"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "boolean"}}),
    obj(
        {
            "level": {"type": "string", "enum": ["low", "mid", "high"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        }
    ),
]


MODEL_DIR = ROOT / "workers" / "demo" / "model"
BATCHES = (1, 8)
TARGET_COST_B8 = 0.10  # the constraint may cost at most 10% of decode tokens/s at batch 8
# The throughput phase's constraint: long enough that every sequence decodes DECODE_TOKENS
# tokens under it, so both sides run full batches for the same number of steps.
LONG = {"type": "array", "items": SCHEMAS[6], "minItems": 12, "maxItems": 12}
DECODE_TOKENS = 48
QUESTIONS = ["Answer in JSON.", "Describe a person.", "hi", "What is the weather in Paris?",
             "Give me a list.", "Tell me about Alice.", "Who are you?", "Write JSON."]  # fmt: skip


def _decode_rate(llm, prompts: list[list[int]], params) -> float:
    """Tokens/s of the decode steps of one batch (its prefill step is not counted)."""
    engine = llm.engine
    for i, p in enumerate(prompts):
        engine.add_request(f"b{i}", p, params)
    engine.step()  # prefill of the whole batch and its first tokens
    tokens, started = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        tokens += sum(len(d.new_token_ids) for d in engine.step())
    return tokens / (time.perf_counter() - started)


def _valid_fraction(llm, prompts, constrained: bool) -> float:
    """Share of answers (each schema, each prompt) that parse and validate against the schema."""
    from workers.engine import SamplingParams

    valid = total = 0
    for i, schema in enumerate(SCHEMAS):
        params = SamplingParams(
            temperature=0.0, max_tokens=128, grammar={"type": "json_schema", "schema": schema} if constrained else None
        )
        batch = [prompts[(i + j) % len(prompts)] for j in range(len(prompts))]
        for out in llm.generate([{"prompt_token_ids": p} for p in batch], params):
            total += 1
            try:
                jsonschema.validate(json.loads(out.outputs[0].text), schema)
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
    return valid / total


def run(args) -> int:
    from workers.engine import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    llm = LLM(str(args.model or MODEL_DIR), device="cpu", dtype="float32", enable_prefix_caching=False)
    tok = llm.engine.tokenizer
    prompts = [tok.prompt_ids(messages=[{"role": "user", "content": q}]) for q in QUESTIONS]
    free = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    constrained = SamplingParams(
        temperature=0.0, max_tokens=DECODE_TOKENS, grammar={"type": "json_schema", "schema": LONG}
    )
    rates: dict[tuple[int, bool], list[float]] = {(b, c): [] for b in BATCHES for c in (False, True)}
    for r in range(args.rounds):
        for b in BATCHES:
            order = (False, True) if r % 2 == 0 else (True, False)  # alternate, so drift hits both alike
            for c in order:
                rates[(b, c)].append(_decode_rate(llm, prompts[:b], constrained if c else free))
    valid = {c: _valid_fraction(llm, prompts, c) for c in (False, True)}
    runs = [
        {
            "batch": b,
            "constrained": c,
            "tok_s": round(statistics.median(rates[(b, c)]), 1),
            "valid_fraction": round(valid[c], 3),
        }
        for b in BATCHES
        for c in (False, True)
    ]
    if not args.json:
        for b in BATCHES:
            base, con = (statistics.median(rates[(b, c)]) for c in (False, True))
            print(
                f"batch {b}: free {base:.1f} tok/s, JSON-schema constrained {con:.1f} tok/s "
                f"(cost {1 - con / base:+.1%})"
            )
        print(
            f"constrained answers valid: {valid[True]:.1%} of {len(SCHEMAS) * len(prompts)} "
            f"(free answers: {valid[False]:.1%}); target: cost <= {TARGET_COST_B8:.0%} at batch 8, 100% valid"
        )
    print(json.dumps({"runs": runs}))
    sys.stdout.flush()
    return 0
