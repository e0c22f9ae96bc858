"""The error every check made before a launch raises: its message says what was wrong and what to do."""


class StudyError(RuntimeError):
    """A problem found before launching; the message says what to do."""
