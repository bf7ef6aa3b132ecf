"""Limits on numbers a user gives more than one command (docs/design.md §6.2): each keeps a typo from
hanging or exhausting the machine before any other check could see it."""

# Seeds fit in a signed 64-bit integer, so every seed derived from one (attnid train's eval and probe
# batches add small offsets) still fits the unsigned 64 bits torch.manual_seed takes
SEED_MAXIMUM = 2**63 - 1
# More threads than any machine has cores only adds contention; a typo of 100000 would start that many
THREADS_MAXIMUM = 1024
