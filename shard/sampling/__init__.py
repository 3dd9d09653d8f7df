"""Next-token selection for a batch: a request's parameters (params.py, plain Python, shared
with the router), a batch's parameters as tensors with their host copy (tensors.py), the
sampler (penalties, warpers, seeded draws, logprobs; sampler.py), the top-k/top-p/typical-p
truncation it works through (truncation.py), and the counter-based random draws that make a
seed reproducible whatever the batch (random_hash.py). Nothing is imported here, so that the
router can import params.py without torch."""
