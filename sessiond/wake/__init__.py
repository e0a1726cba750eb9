"""Triggers: cron, every, watch, bind (dependencies) and git. They decide *when* a
session should continue and call back into the syscalls; they never start a run
themselves."""
