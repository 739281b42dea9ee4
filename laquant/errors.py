"""The one exception type users see: its message names the problem and the fix."""


class LaquantError(Exception):
    """Bad input or an unsupported model; the CLI prints the message alone and exits non-zero."""
