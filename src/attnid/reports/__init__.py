"""Reports: gathering runs into tables and claims (:mod:`.tables`), the studies (:mod:`.studies`), the
edits table (:mod:`.edits_table`), figures (:mod:`.figures`) and the LaTeX appendix (:mod:`.latex`,
templates in ``templates/``). May import: ``plan``, ``training``, ``measure``, ``model``, ``theory``,
``common``."""
