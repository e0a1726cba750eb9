"""The process table and the rules it keeps: specs, the lifecycle transition
table, tool policy, the resume gate and the scheduler queue.

It sits on the log (sessiond.log) and below everything that acts."""
