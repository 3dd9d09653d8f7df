"""A CPU stand-in for `torch.cuda.set_sync_debug_mode("error")`: fails on every operation that,
on a GPU, would make the host wait for the device.

On a CPU nothing waits, so the guard recognises the operations themselves: reading a tensor's
value on the host (`item`, `int()`, `bool()`, `tolist`, `.cpu()`, `.numpy()`), and the ops whose
output shape depends on the data (`nonzero`, boolean indexing, `masked_select`, `unique`,
`repeat_interleave` without its output size), which CUDA can only size by asking the device,
and tensors made from host data (`torch.tensor(...)`), which reach a GPU by a copy the host
waits for unless it comes from pinned memory (a step's one upload, before the guard).
Code under the guard that is the device's own concern on the CPU (the CPU attention backend
in a model's forward pass) runs inside `guard.paused()`.

    with HostSyncGuard() as guard:
        ...                      # fails with the op and where it ran from
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Ops whose result the host must read (or size) from the device.
_SYNCING_OPS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.unique_dim.default,
    aten.equal.default,
    aten.is_nonzero.default,
    # torch.tensor(host data) inside a step: on a GPU an unpinned copy the host waits for
    aten.lift_fresh.default,
}
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}
_HOST_READS = {"tolist", "numpy", "cpu", "item", "__bool__", "__int__", "__float__", "__index__"}


class HostSyncError(AssertionError):
    pass


def _where() -> str:
    frames = [
        f
        for f in traceback.extract_stack()
        if "/torch/" not in f.filename and __file__ != f.filename
    ]
    return "".join(traceback.format_list(frames[-4:]))


class _Dispatch(TorchDispatchMode):
    def __init__(self, guard: HostSyncGuard) -> None:
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.guard.active:
            if func in _SYNCING_OPS:
                self.guard.fail(str(func))
            elif func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
                self.guard.fail("repeat_interleave without output_size")
            elif func in _INDEX_OPS:
                indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
                if any(i is not None and i.dtype == torch.bool for i in indices):
                    self.guard.fail(f"{func} with a boolean index")
        return func(*args, **kwargs)


class _Function(TorchFunctionMode):
    def __init__(self, guard: HostSyncGuard) -> None:
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.guard.active and getattr(func, "__name__", "") in _HOST_READS:
            self.guard.fail(f"Tensor.{func.__name__}")
        return func(*args, **(kwargs or {}))


class HostSyncGuard:
    def __init__(self) -> None:
        self.active = True
        self.checked = 0  # how many times the guard was entered: a test can see it ran

    def fail(self, what: str) -> None:
        self.active = False  # the traceback's own formatting must not trip it again
        raise HostSyncError(f"{what} would make the host wait for the device, at:\n{_where()}")

    @contextmanager
    def paused(self) -> Iterator[None]:
        was, self.active = self.active, False
        try:
            yield
        finally:
            self.active = was

    def __enter__(self) -> HostSyncGuard:
        self.checked += 1
        self._modes = (_Function(self), _Dispatch(self))
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class CudaSyncGuard:
    """torch's own sync debug mode on a CUDA device: an error on every synchronisation."""

    def __enter__(self) -> None:
        torch.cuda.synchronize()  # what came before is not the guarded code's
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc) -> None:
        torch.cuda.set_sync_debug_mode("default")


def guard_launches(runner, guard_for, exempt_forward: bool = False) -> list:
    """Wraps every launch of `runner` in the guard `guard_for()` makes, the model's forward pass
    paused under it where `exempt_forward` (HostSyncGuard on a CPU); returns the guards."""
    launch, guards = runner._launch, []

    @functools.wraps(launch)
    def guarded(*args, **kwargs):
        guards.append(guard_for())
        with guards[-1]:
            return launch(*args, **kwargs)

    def exempt(fn):
        @functools.wraps(fn)
        def forward(*args, **kwargs):
            with guards[-1].paused():
                return fn(*args, **kwargs)

        return forward

    runner._launch = guarded
    if exempt_forward:
        runner.forward = exempt(runner.model)
        if runner.graphs is not None:
            runner.graphs.forward = exempt(runner.model)  # read at each replay
    return guards
