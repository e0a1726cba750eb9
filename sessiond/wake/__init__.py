"""Triggers: cron, every, watch, bind (dependencies) and git. They decide *when* a
session should continue and call back into the syscalls; they never start a run
themselves.

triggers.py is the coordinator (class Triggers); timers.py (cron, every, over the
APScheduler adapter in cron.py), watch.py (watch, bind, reconciliation) and git.py
are its parts; armed.py is the per-session state they share, globs.py the glob
dialect, and host.py the protocol naming what they need of the kernel above."""
