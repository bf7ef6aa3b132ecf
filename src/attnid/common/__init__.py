"""The bottom layer: the one error type a user sees (:mod:`.errors`), file handling (:mod:`.files`: atomic
writes, reading what a user hands us without running code from it), the rule every output obeys
(:mod:`.outputs`), stored tensor shapes against a config (:mod:`.shapes`), free memory and the refusal of
work that cannot fit (:mod:`.memory`), and progress lines on silent work (:mod:`.progress`).
Imports no other layer."""
