"""The theory, as pure functions: the two circuits (:mod:`.circuits`), the geometry of a factor pair's
``GL_D`` orbit (:mod:`.factor_pairs`) and of the RoPE commutant (:mod:`.rope`), one type per orbit
(:mod:`.orbits`), the closed-form counts (:mod:`.counts`, from :mod:`.hf_config` for any Hugging Face
config) and their check by a Jacobian's nullity (:mod:`.nullity`). May import: ``common``."""
