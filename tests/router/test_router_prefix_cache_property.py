"""Property test (hypothesis) of the allocator with its prefix cache over random sequences of
admissions, computed steps and frees in a cache small enough to evict all the time.

A model of the KV cache follows along: every slot a request computes records the adapter and
the tokens up to that position (what its K/V depend on), and for a longrope model (a rope regime
boundary) whether the shards rotated it with the long tables: every position of a prompt longer
than the boundary, the generated positions past it otherwise, and every position of a short
prompt's sequence once it computes the boundary's position (the shards recompute it whole
there, rewriting its blocks). Admission asks as the queue does, with the positions the request
may reach. Then, whatever the sequence:
- a cached prefix handed to a request holds exactly that request's K/V;
- no block a live request holds is handed out again as a fresh block, and nobody writes into
  a block another live request holds (a block in use is never reused);
- an admission fails only when the blocks no live request holds are too few (eviction loses
  no request), and the counts add up (used + free = capacity, shared tokens = extra holds).
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from router.block_allocator import BlockAllocator
from router.prefix_cache import PrefixCache

BS = 2
BLOCKS = 12  # block 0 reserved: 11 usable, a few requests fill them

prompts = st.lists(st.integers(0, 2), min_size=1, max_size=9)  # 3 ids: prefixes repeat a lot


class AllocatorMachine(RuleBasedStateMachine):
    BOUNDARY = 0  # the shards' rope_regime_boundary: none

    def __init__(self) -> None:
        super().__init__()
        cache = PrefixCache(BS, self.BOUNDARY)
        self.a = BlockAllocator(BLOCKS, BS, reserved=1, prefix_cache=cache)
        self.live: dict[int, dict] = {}  # request -> allocation, tokens, adapter, computed
        self.kv: dict[int, tuple] = {}  # slot -> (adapter, long tables, tokens up to it)
        self.next_id = 0

    def content(self, r: dict, p: int) -> tuple:
        # A prompt position's sequence is the whole prompt, a generated one's p + 1 long; all
        # long once the sequence was recomputed at the boundary.
        long = r["crossed"] or 0 < self.BOUNDARY < max(r["prompt_len"], p + 1)
        return r["adapter"], long, tuple(r["tokens"][: p + 1])

    @rule(prompt=prompts, max_new=st.integers(0, 4), adapter=st.sampled_from(["", "x"]))
    def admit(self, prompt, max_new, adapter):
        match = self.a.match(prompt, adapter, len(prompt), len(prompt) + max_new)
        held = {b for r in self.live.values() for b in r["alloc"].blocks}
        shared = self.a.shared_by(match)
        alloc = self.a.allocate(len(prompt) + max_new, match)
        fresh = -(-(len(prompt) + max_new) // BS) - len(match.blocks)
        if alloc is None:
            # Refused only when the blocks nobody holds (cached or not) are too few.
            available = BLOCKS - 1 - len(held | set(match.blocks))
            assert fresh > available
            return
        assert alloc.cached_tokens == len(match.blocks) * BS < len(prompt)
        assert shared == len(held & set(match.blocks)) * BS
        assert not set(alloc.blocks[len(match.blocks) :]) & held, "a block in use handed out"
        r = {"alloc": alloc, "tokens": list(prompt), "adapter": adapter, "done": 0}
        r["prompt_len"], r["crossed"] = len(prompt), False
        for p in range(alloc.cached_tokens):
            assert self.kv.get(alloc.slots[p]) == self.content(r, p), "wrong cached K/V"
        r["done"] = alloc.cached_tokens
        self.live[self.next_id] = r
        self.next_id += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data(), steps=st.integers(1, 5))
    def compute(self, data, steps):
        """The shards compute the next positions (prompt, then tokens they generate)."""
        rid = data.draw(st.sampled_from(sorted(self.live)))
        r = self.live[rid]
        alloc = r["alloc"]
        # The last position is reserved but never computed: its token is the request's last
        # sample, never fed back (so a sequence whose last position is the boundary never
        # crosses, as PrefixCache.may_cross counts). The prompt is computed whole.
        end = min(r["done"] + steps, max(r["prompt_len"], len(alloc.slots) - 1))
        while len(r["tokens"]) < end:
            r["tokens"].append(data.draw(st.integers(0, 2)))
        others = {b for i, o in self.live.items() if i != rid for b in o["alloc"].blocks}
        for p in range(r["done"], end):
            written = [p]
            if 0 < self.BOUNDARY == p and r["prompt_len"] <= p:
                # The short prompt's sequence crosses: recomputed whole with the long tables.
                r["crossed"], written = True, list(range(p + 1))
            for q in written:
                assert alloc.blocks[q // BS] not in others, "wrote into a block another holds"
                self.kv[alloc.slots[q]] = self.content(r, q)
        r["done"] = end
        self.a.commit(alloc, end, lambda: r["tokens"])

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.a.free(self.live.pop(rid)["alloc"].blocks)

    @rule(adapter=st.sampled_from(["", "x"]))
    def unload(self, adapter):
        if not any(r["adapter"] == adapter for r in self.live.values()):
            self.a.forget_adapter(adapter)

    @invariant()
    def counts_add_up(self):
        holds: dict[int, int] = {}
        for r in self.live.values():
            for b in r["alloc"].blocks:
                holds[b] = holds.get(b, 0) + 1
        assert self.a.used_blocks == len(holds)
        assert self.a.used_blocks + self.a.free_blocks == self.a.capacity_blocks
        assert self.a.shared_tokens == BS * sum(n - 1 for n in holds.values())


AllocatorMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_allocator_with_prefix_cache = AllocatorMachine.TestCase


class LongropeAllocatorMachine(AllocatorMachine):
    """Prompts of up to 9 tokens on both sides of a boundary of 4, generated tokens past it
    (short prompts' sequences recomputed there)."""

    BOUNDARY = 4


LongropeAllocatorMachine.TestCase.settings = AllocatorMachine.TestCase.settings
test_allocator_with_longrope_prefix_cache = LongropeAllocatorMachine.TestCase
