"""Training: the data (:mod:`.data`, :mod:`.batches`), the optimizer cases (:mod:`.cases`), the options
of ``attnid train`` (:mod:`.config`), the run (:mod:`.train`, :mod:`.loop`, :mod:`.precision`,
:mod:`.runtime`, :mod:`.gpu_slots`) and its directory (:mod:`.rundir`). May import: ``measure``,
``model``, ``theory``, ``common``."""
