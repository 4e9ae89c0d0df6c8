"""Errors the engine raises at its public surface."""


class ModelLoadError(Exception):
    """A model could not be loaded. The message says what is wrong and what to do about it."""


class CapacityError(Exception):
    """The engine's request queue is full; retry later or raise ``max_waiting``."""
