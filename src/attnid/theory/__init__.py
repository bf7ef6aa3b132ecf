"""The theory, as pure functions that read no file: the two circuits (:mod:`.circuits`), the geometry of a
factor pair's ``GL_D`` orbit (:mod:`.factor_pairs`) and of the RoPE commutant (:mod:`.rope`), one type per
orbit (:mod:`.orbits`), the closed-form counts of attention (:mod:`.counts`) and of a whole model
(:mod:`.whole_model`), real architectures (:mod:`.architectures`, from the shipped ``architectures.yaml`` or,
through :mod:`.hf_config`, any Hugging Face config's settings) and their check by a Jacobian's nullity
(:mod:`.nullity`, :mod:`.census`, :mod:`.census_grid`). The command line reads the files. May import:
``common``."""
