"""The one error type for bad input: it names the config key and says how to fix it."""


class ConfigError(ValueError):
    """Bad input. `str(err)` is one sentence naming the key and the fix (`problem` may itself be
    a whole error line, when `key` says where it happened: a point of a sweep)."""

    def __init__(self, key: str, problem: str, fix: str | None = None):
        self.key = key
        super().__init__(f"{key}: {problem}; {fix}." if fix else f"{key}: {problem}")
