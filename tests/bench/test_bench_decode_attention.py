"""bench/decode_attention.py: every decode path it times computes the paged attention a float64
computation from the block tables gives, for every case, and it reports one row per case."""

from bench import decode_attention
from shard.platforms.cpu.native.build import unavailable_reason


def test_every_path_matches_float64_on_every_case(capsys):
    rows = decode_attention.main(["--dtype", "float32", "--repeats", "1"])
    assert [(r["batch"], r["context"]) for r in rows] == decode_attention.CASES
    # The native kernel is timed wherever it can be built (CI's machines can).
    paths = ["matmul", "sdpa"] + (["native"] if unavailable_reason() is None else [])
    for row in rows:
        for path in paths:
            assert row[f"{path}_err"] < 1e-5 and row[f"{path}_ms"] > 0, (path, row)
    assert len(capsys.readouterr().out.strip().splitlines()) == 2 + len(decode_attention.CASES)
