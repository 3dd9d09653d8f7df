"""Multi-LoRA on the shard: PEFT adapters read from disk (adapter.py), a host LRU cache and
device slots (manager.py). The per-layer slot buffers and the LoRA term live in
shard/layers/lora.py, held by the TP linears."""
