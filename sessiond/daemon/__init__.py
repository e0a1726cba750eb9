"""Wiring only: start-up, shutdown, signals, systemd, the sessiond command."""
