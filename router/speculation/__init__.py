"""Speculative decoding, the router's half: n-gram (prompt lookup) proposals sent with each step
for the shards to verify in one forward pass (docs/architecture.md, "Speculative decoding").

config.py (the flags' settings), flags.py (argparse, shared with the launcher), ngram.py (the
proposer), speculator.py (per step: what to propose, what came of it), grammar.py (proposals
for structured output). Import the modules themselves: the launcher reads the flags without
loading the router's scheduling code.
"""
