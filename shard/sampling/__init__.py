"""Next-token selection for a batch: the sampler (penalties, warpers, seeded draws, logprobs;
sampler.py), the top-k/top-p/typical-p truncation it works through (truncation.py), and the
counter-based random draws that make a seed reproducible whatever the batch (random_hash.py)."""

from shard.sampling.sampler import SampleOutput, SamplingParams, SamplingTensors, sample

__all__ = ["SampleOutput", "SamplingParams", "SamplingTensors", "sample"]
