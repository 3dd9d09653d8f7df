"""The shards' fault hooks (shard/faults.py) that integration-tests/test_faults.py drives: off
unless set, per rank, and counting only what they say they count."""

import threading

import pytest

from shard.faults import Faults, InjectedFault


def test_off_unless_set_and_only_on_the_named_ranks():
    assert Faults.from_env(0, {}) is None
    env = {"SWITCHYARD_FAULT_FAIL_FORWARD": "2", "SWITCHYARD_FAULT_RANKS": "1, 3"}
    assert Faults.from_env(0, env) is None
    assert Faults.from_env(3, env) == Faults(fail_forward=2)
    assert Faults.from_env(0, {"SWITCHYARD_FAULT_REFUSE_STEP": "1"}) == Faults(refuse_step=1)


def test_the_nth_forward_fails_and_the_nth_step_is_refused_once():
    faults = Faults(fail_forward=2, refuse_step=3)
    faults.before_forward()
    with pytest.raises(InjectedFault, match="forward 2"):
        faults.before_forward()
    faults.before_forward()  # only the Nth
    faults.before_step()
    faults.before_step()
    with pytest.raises(ValueError, match="step 3 refused"):  # a refusal: INVALID_ARGUMENT
        faults.before_step()
    faults.before_step()


def test_the_nth_forward_never_returns():
    faults = Faults(hang_forward=1)
    worker = threading.Thread(target=faults.before_forward, daemon=True)
    worker.start()
    worker.join(0.3)
    assert worker.is_alive()
