"""The root of tfc's typed errors; the CLI turns any of them into one line and exit code 2."""


class TfcError(Exception):
    """A failure a user can act on: bad input, a damaged image, a refused option."""

    exit_code = 2
