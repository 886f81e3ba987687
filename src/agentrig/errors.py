"""Errors that are the user's to fix (bad config, malformed files): the CLI prints them without a traceback.

Model mistakes are never raised: they become observations in the episode (see protocol.DEFECT_KINDS).
"""


class AgentrigError(Exception):
    """A problem with the user's input or set-up; the message says what to do."""


class ConfigError(AgentrigError):
    """A bad configuration value or key."""


class DataError(AgentrigError):
    """A malformed input file; the message names the file and line."""
