"""Native CPU kernels (C++, built at the shard's first start): build.py says which and why."""
