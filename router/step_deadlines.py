"""How long the router waits for a step before it declares the shards hung (--shard-step-timeout).

A shard that stops mid-step (SIGSTOP, a deadlocked kernel or collective) answers nothing, and
without a deadline every request on it would wait forever while /health, answered by a live
event loop on the shard, could still say 200. The deadline is generous and grows with the
step: `--shard-step-timeout` seconds for a decode step, one more such budget per
TOKENS_PER_BUDGET prompt tokens it computes (a long prefill on a CPU takes minutes), and
WARM_FACTOR times that for the first WARM_STEPS steps after start, when kernels are still
compiled and autotuned for shapes the warmup did not reach.
"""

from __future__ import annotations

from dataclasses import dataclass

TOKENS_PER_BUDGET = 1024
WARM_STEPS = 10
WARM_FACTOR = 10.0
DEFAULT_STEP_TIMEOUT_S = 60.0


@dataclass
class StepDeadlines:
    base_s: float | None = DEFAULT_STEP_TIMEOUT_S  # None: steps are never timed out
    steps: int = 0  # started since the router did

    def next_step(self, tokens: int) -> float | None:
        """The deadline of the step about to start, computing `tokens` tokens."""
        self.steps += 1
        if self.base_s is None:
            return None
        budget = self.base_s * (1 + tokens / TOKENS_PER_BUDGET)
        return budget * WARM_FACTOR if self.steps <= WARM_STEPS else budget

    @property
    def between_steps_s(self) -> float | None:
        """FilterBatch and ClearCache: no model work, but queued behind a step on the shard."""
        return self.base_s
