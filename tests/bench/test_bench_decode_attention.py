"""bench/decode_attention.py: both decode paths it times compute the paged attention a float64
computation from the block tables gives, for every case, and it reports one row per case."""

from bench import decode_attention


def test_both_paths_match_float64_on_every_case(capsys):
    rows = decode_attention.main(["--dtype", "float32", "--repeats", "1"])
    assert [(r["batch"], r["context"]) for r in rows] == decode_attention.CASES
    for row in rows:
        assert row["matmul_err"] < 1e-5 and row["sdpa_err"] < 1e-5, row
        assert row["matmul_ms"] > 0 and row["sdpa_ms"] > 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2 + len(decode_attention.CASES)
