"""sessiond: schedules AI-agent sessions the way an operating system schedules processes."""

__version__ = "0.1.0"
