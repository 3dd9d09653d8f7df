"""bench/sdpa_layouts.py: both layouts it times compute the same attention, and it prints one
row per case with positive timings and their ratio."""

from bench import sdpa_layouts


def test_layouts_agree_and_every_case_is_timed(capsys):
    sdpa_layouts.main(["--dtype", "float32", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[2:]]
    assert [(int(r[0]), int(r[1])) for r in rows] == sdpa_layouts.CASES
    for _, _, old, new, ratio, diff in rows:
        assert float(old) > 0 and float(new) > 0
        # Printed times are rounded to the microsecond: the ratio of the printed times is
        # the printed ratio up to that rounding.
        printed = float(ratio.removesuffix("x"))
        assert abs(printed - float(old) / float(new)) <= 0.02 * printed + 0.01
        assert float(diff) < 1e-5  # float32: the fused kernel and the math path agree
