"""The bottom layer: the one error type a user sees (:mod:`.errors`) and file handling (:mod:`.files`:
atomic writes, reading what a user hands us without running code from it). Imports no other layer."""
