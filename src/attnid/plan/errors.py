"""The one error of a pipeline config: a line that names the key and the problem."""

from __future__ import annotations

from attnid.common.errors import UserError

# A config error is one line on stderr: a message that quotes a huge value (a YAML alias bomb, a
# megabyte of text) is cut here.
MESSAGE_LIMIT = 300


class ConfigError(UserError):
    """A problem of the user's pipeline config: ``<key>: <problem>``, one line (the workflow prints it as
    ``config error: <key>: <problem>``)."""

    def __init__(self, key: str, problem: str) -> None:
        line = " ".join(f"{key}: {problem}".split())
        if len(line) > MESSAGE_LIMIT:
            line = line[: MESSAGE_LIMIT - 5] + " ..."
        super().__init__(line)
