"""`python -m shard.platforms.cpu.native`: builds this CPU's kernels now (make install does)."""

from shard.platforms.cpu.native.build import main

raise SystemExit(main())
