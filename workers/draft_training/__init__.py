"""Offline tools for speculative decoding: `train_eagle3` trains an EAGLE-3 draft head for a
target model (the engine's drafting lives in workers/engine/speculative)."""
