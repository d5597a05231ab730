"""The one exception type zepp raises for bad input.

Messages name the file, field or row that is wrong and say what would fix it. The command
line prints them without a traceback.
"""


class ZeppInputError(ValueError):
    """Bad user input: a file, option or array that zepp cannot use as given."""
