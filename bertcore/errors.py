"""Errors a user can cause. Each carries one sentence naming the file, key or offset and
what to do; the CLI prints it as one line instead of a traceback."""


class BertpipeError(Exception):
    """Base class for errors caused by input or configuration, not by a bug."""


class ConfigError(BertpipeError):
    """A recipe or override is invalid; the message names the dotted key."""


class InputDataError(BertpipeError):
    """An input file cannot be read; the message names the file and, where known, the byte offset."""
