"""How long a simulated step takes: a linear model of one engine on one machine.

    step = [prefill_base + prefill_per_token · P]          if the step computes P prompt tokens
         + [decode_base + decode_per_seq · B + decode_per_context_token · C]
                                                         if it decodes B sequences holding C tokens

A profile is JSON with these fields (seconds), `kv_bytes_per_token` (the KV cache's size per
token, which sizes the cache from the replica's kv_cache_bytes) and `source` (how it was
obtained). `python -m workers.bench profile --out FILE` fits one for the real engine here;
workers/sim/profiles/ holds the shipped ones, named by file stem."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

PROFILES = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = "cpu-demo"


class ProfileError(ValueError):
    pass


@dataclass(frozen=True)
class SimProfile:
    prefill_base: float
    prefill_per_token: float
    decode_base: float
    decode_per_seq: float
    decode_per_context_token: float
    kv_bytes_per_token: int
    source: str = ""

    def step_seconds(self, prefill_tokens: int, decode_seqs: int, context_tokens: int) -> float:
        seconds = 0.0
        if prefill_tokens:
            seconds += self.prefill_base + self.prefill_per_token * prefill_tokens
        if decode_seqs:
            seconds += self.decode_base + self.decode_per_seq * decode_seqs
            seconds += self.decode_per_context_token * context_tokens
        return seconds

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> SimProfile:
        if not isinstance(data, dict):
            raise ProfileError(f"a profile is a JSON object, got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        missing = sorted(n for n in names - set(data) if n != "source")
        if unknown or missing:
            raise ProfileError(f"profile fields: unknown {unknown}, missing {missing}")
        for name in names - {"source"}:
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ProfileError(f"profile field {name} must be a number >= 0, got {value!r}")
        if data["kv_bytes_per_token"] <= 0:
            raise ProfileError("profile field kv_bytes_per_token must be > 0")
        return cls(**{**data, "kv_bytes_per_token": int(data["kv_bytes_per_token"])})


def shipped_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES.glob("*.json"))


def load_profile(name_or_path: str | Path) -> SimProfile:
    """A shipped profile by name, or a profile file."""
    path = Path(name_or_path)
    if not path.suffix and (PROFILES / f"{name_or_path}.json").is_file():
        path = PROFILES / f"{name_or_path}.json"
    if not path.is_file():
        raise ProfileError(f"no simulation profile {str(name_or_path)!r}: a file, or one of {shipped_profiles()}")
    try:
        return SimProfile.from_dict(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise ProfileError(f"{path}: invalid JSON ({exc})") from None
