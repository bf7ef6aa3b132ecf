"""Checkpoints a user hands us: reading and writing them without running their code
(:mod:`.checkpoints`), the function-preserving edits (:mod:`.operations`) and the held-out batch they
are proved on (:mod:`.heldout`). May import: ``plan``, ``training``, ``measure``, ``model``, ``theory``,
``common``."""
