"""The one error type every subcommand raises for bad input: it becomes one line on stderr and exit 2."""


class UsageError(Exception):
    """Bad input from the user (arguments, files, environment); never a bug in commcal."""
