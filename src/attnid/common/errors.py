"""The one exception type the command line turns into a one-line message."""


class UserError(Exception):
    """A problem the user can fix (bad flag, bad config, missing file, wrong checksum).

    ``attnid`` prints ``attnid <command>: error: <message>`` and exits 2 instead of
    showing a traceback. The message should say what to do, not only what failed.
    """
