"""The run spec (RunSpec, its Enums and a dataclass a config group), the checks of each
group, ConfigError, the measurement protocol's numbers and Hydra-style target nodes."""
