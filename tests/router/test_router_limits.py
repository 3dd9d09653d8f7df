"""CLI parsing, TGI-like default limits, and the checks that refuse impossible limits."""

import pytest

from router.args import RouterArgs, parse_args
from router.limits import ConfigError, apply_capacity, resolve_limits
from router.warmup import build_warmup_batch


def args(**kw) -> RouterArgs:
    return RouterArgs(model_id="m", shard_uds_path="/tmp/s", **kw)


def test_cli_flags_and_defaults():
    a = parse_args(["--model-id", "/m", "--shard-uds-path", "/tmp/sock"])
    assert a == RouterArgs(model_id="/m", shard_uds_path="/tmp/sock")
    assert (a.hostname, a.port, a.max_concurrent_requests) == ("0.0.0.0", 3000, 128)
    assert (a.max_stop_sequences, a.max_best_of) == (4, 2)
    assert (a.waiting_served_ratio, a.max_waiting_tokens) == (0.3, 20)
    a = parse_args(
        "--model-id /m --shard-uds-path /s --hostname 127.0.0.1 --port 8080 "
        "--max-input-tokens 100 --max-total-tokens 200 --max-batch-prefill-tokens 300 "
        "--max-batch-total-tokens 4000 --max-concurrent-requests 7 --max-stop-sequences 2 "
        "--max-best-of 3 --waiting-served-ratio 1.2 --max-waiting-tokens 5 "
        "--served-model-name tiny".split()
    )
    assert a.max_input_tokens == 100 and a.max_batch_total_tokens == 4000
    assert a.model_name == "tiny" and a.port == 8080 and a.waiting_served_ratio == 1.2


def test_zero_batch_total_tokens_means_unset():
    a = parse_args("--model-id m --shard-uds-path s --max-batch-total-tokens 0".split())
    assert a.max_batch_total_tokens is None


@pytest.mark.parametrize("flag", ["--port 0", "--max-total-tokens -1", "--waiting-served-ratio -1"])
def test_bad_flag_values_exit(flag):
    with pytest.raises(SystemExit):
        parse_args(["--model-id", "m", "--shard-uds-path", "s", *flag.split()])


def test_defaults_follow_the_model_context():
    lim = resolve_limits(args(), max_position_embeddings=4096, block_size=16)
    assert (lim.max_input_tokens, lim.max_total_tokens) == (1024, 2048)
    assert lim.max_batch_prefill_tokens == 4096  # TGI's default prefill budget
    lim = resolve_limits(args(), max_position_embeddings=2048, block_size=16)
    assert lim.max_batch_prefill_tokens == 2048  # capped at the context length
    lim = resolve_limits(args(), max_position_embeddings=512, block_size=16)
    assert (lim.max_input_tokens, lim.max_total_tokens) == (511, 512)
    assert lim.max_batch_prefill_tokens == 561  # but one full prompt always fits, with headroom
    lim = resolve_limits(args(max_total_tokens=300), 4096, 16)
    assert lim.max_input_tokens == 299
    lim = resolve_limits(args(max_input_tokens=3000), 4096, 16)
    assert lim.max_total_tokens == 3001
    lim = resolve_limits(args(max_input_tokens=8000), 16384, 16)
    assert lim.max_batch_prefill_tokens == 8050


@pytest.mark.parametrize(
    "kw,mpe,flag",
    [
        ({"max_input_tokens": 100, "max_total_tokens": 100}, 4096, "--max-input-tokens"),
        ({"max_total_tokens": 5000}, 4096, "--max-total-tokens"),
        (
            {"max_input_tokens": 100, "max_batch_prefill_tokens": 99, "prefill_chunking": False},
            4096,
            "--max-batch-prefill-tokens",
        ),
        (
            {"max_total_tokens": 200, "max_batch_total_tokens": 150},
            4096,
            "--max-batch-total-tokens",
        ),
        ({"max_total_tokens": 1}, 4096, "--max-total-tokens"),
    ],
)
def test_impossible_flags_are_refused_by_name(kw, mpe, flag):
    with pytest.raises(ConfigError, match=flag):
        resolve_limits(args(**kw), mpe, 16)


def test_chunking_lets_prompts_outgrow_the_prefill_budget_and_bounds_chunks_on_cpu():
    lim = resolve_limits(args(max_input_tokens=100, max_batch_prefill_tokens=99), 4096, 16)
    assert (lim.max_input_tokens, lim.max_batch_prefill_tokens) == (100, 99)
    cpu = resolve_limits(args(), 4096, 16, "cpu")
    assert (cpu.max_batch_prefill_tokens, cpu.prefill_chunk_tokens) == (4096, 64)
    gpu = resolve_limits(args(), 4096, 16, "cuda")
    assert (gpu.max_batch_prefill_tokens, gpu.prefill_chunk_tokens) == (4096, 4096)
    small = resolve_limits(args(max_batch_prefill_tokens=40), 4096, 16, "cpu")
    assert small.prefill_chunk_tokens == 40
    given = resolve_limits(args(prefill_chunk_tokens=300), 4096, 16, "cpu")
    assert given.prefill_chunk_tokens == 300
    with pytest.raises(ConfigError, match="--prefill-chunk-tokens"):
        resolve_limits(args(prefill_chunk_tokens=5000), 8192, 16, "cpu")
    # Fitting to a small cache keeps the chunk within the clamped prefill budget.
    fitted = apply_capacity(given, max_supported_total_tokens=16 * 200, num_blocks=200)
    assert fitted.prefill_chunk_tokens == 300
    tiny = resolve_limits(args(max_total_tokens=64, max_input_tokens=60), 4096, 16, "cuda")
    assert apply_capacity(tiny, 80, 6).prefill_chunk_tokens == 80


def test_capacity_from_warmup():
    lim = resolve_limits(args(max_total_tokens=64, max_input_tokens=32), 4096, 16)
    fitted = apply_capacity(lim, max_supported_total_tokens=16 * 10, num_blocks=10)
    # One block is reserved, so the batch budget is what the other nine hold.
    assert fitted.batch_total_tokens == 144 and fitted.usable_blocks == 9
    assert fitted.max_batch_prefill_tokens == 144  # the default 4096, clamped to the cache
    with pytest.raises(ConfigError, match="--max-total-tokens"):
        apply_capacity(lim, max_supported_total_tokens=48, num_blocks=3)
    with pytest.raises(ConfigError, match="--max-total-tokens"):
        apply_capacity(lim, max_supported_total_tokens=64, num_blocks=4)  # 4 needed, 3 usable
    with pytest.raises(ConfigError, match="empty KV cache"):
        apply_capacity(lim, max_supported_total_tokens=0, num_blocks=0)
    lim = resolve_limits(args(max_total_tokens=64, max_batch_total_tokens=1000), 4096, 16)
    with pytest.raises(ConfigError, match="--max-batch-total-tokens"):
        apply_capacity(lim, max_supported_total_tokens=160, num_blocks=10)


def test_prefill_budget_is_clamped_to_a_small_cache():
    lim = resolve_limits(args(max_total_tokens=64, max_input_tokens=60), 4096, 16)
    assert lim.max_batch_prefill_tokens == 4096
    fitted = apply_capacity(lim, max_supported_total_tokens=80, num_blocks=6)
    assert fitted.batch_total_tokens == 80 and fitted.max_batch_prefill_tokens == 80


def test_warmup_batch_fills_the_prefill_budget_within_a_small_block_range():
    lim = resolve_limits(
        args(max_input_tokens=100, max_total_tokens=130, max_batch_prefill_tokens=250), 4096, 16
    )
    batch = build_warmup_batch(lim, vocab_size=50)
    assert [len(r.input_ids) for r in batch.requests] == [100, 100, 50]
    assert batch.size == 3 and batch.max_blocks == 9  # ceil(130 / 16)
    for r in batch.requests:
        positions = len(r.input_ids) + r.stopping_parameters.max_new_tokens
        assert positions == 130 and len(r.slots) == positions
        assert list(r.blocks) == list(range(9))
        assert all(r.slots[p] == r.blocks[p // 16] * 16 + p % 16 for p in range(positions))
        assert max(r.input_ids) < 50 and r.prefill_logprobs and r.parameters.do_sample
