"""Reports: gathering runs into tables and claims (:mod:`.tables`), the studies (:mod:`.studies`), the
edits table (:mod:`.edits_table`), figures (:mod:`.figures`, one module per figure) and the LaTeX appendix
(:mod:`.appendix`, :mod:`.latex`, templates in ``templates/``). May import: ``plan``, ``training``,
``measure``, ``model``, ``theory``, ``common``."""
